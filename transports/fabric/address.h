// A rank's published fabric address, "fabric:<endpoint name>:<nonce>" (both in hex): listen()
// returns it, and connect() reads every peer's back, inserting the endpoint name into the
// address vector and binding the nonce into the frame tokens (wire.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "transports/fabric/wire.h"

namespace nanoccl::fabric {

// `name` is the endpoint's name (fi_getname, `nameBytes` long), `nonce` kNonceBytes.
std::string formatAddress(const void* name, size_t nameBytes, const uint8_t* nonce);

// Reads back what formatAddress() wrote: false for anything else (another transport's address,
// bad hex, an empty name, a nonce that is not kNonceBytes).
bool parseAddress(const std::string& text, std::vector<uint8_t>* name,
                  std::vector<uint8_t>* nonce);

}  // namespace nanoccl::fabric
