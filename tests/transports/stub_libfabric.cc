// Built as libfabric.so.1 for fabric_transport_test.cc: a library by libfabric's name that has
// none of its functions.
extern "C" int nanoccl_stub_libfabric() { return 0; }
