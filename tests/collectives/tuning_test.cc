// The link profile (collectives/tuning.h): its file format, and how the ranks of a
// communicator agree on one (measured, cached, refused).
#include "collectives/tuning.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "collectives/tuning_probe.h"
#include "tests/collectives/test_util.h"

namespace nanoccl {
namespace {

using colltest::createEach;
using colltest::makeWorld;
using colltest::WorldOptions;

LinkProfile sampleProfile() {
  LinkProfile p;
  p.shape = "2x2";
  p.transport = "tcp";
  p.nsocks = 2;
  p.measured = "2026-11-24T15:02:11Z";
  p.inter = {true, 61.25, 117.5, 118.0};
  p.intra = {true, 9.5, 3100, 3000};
  p.reduceMBps = 5200;
  p.cpuShare = 0.5;
  p.codecs = {{"int8", 2100, 3500, 3000}, {"bf16", 4000, 5000, 4500}};
  return p;
}

// A directory of this test's own, removed with its files.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/nanoccl_tuning_XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() { (void)std::system(("rm -rf '" + path_ + "'").c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string readFile(const std::string& path) {
  std::ifstream f(path);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

void writeFile(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::trunc);
  f << text;
}

// A node probe's transfer less what its closing barrier costs: the fastest of the empty ones
// timed before it, so that one slow empty barrier (the machine's hiccup) does not make the
// link look faster than it is.
TEST(TuningProbe, ASlowEmptyBarrierDoesNotShortenTheTransfer) {
  using tuning_probe::transferSeconds;
  EXPECT_DOUBLE_EQ(transferSeconds(0.010, {0.0003, 0.008, 0.0002}), 0.0098);
  EXPECT_DOUBLE_EQ(transferSeconds(0.010, {}), 0.010);
  EXPECT_DOUBLE_EQ(transferSeconds(0.001, {0.002, 0.003}), 1e-6);  // never zero or less
}

TEST(LinkProfileText, RoundTrips) {
  const LinkProfile p = sampleProfile();
  Result<LinkProfile> back = LinkProfile::parse(p.toText(), "test");
  ASSERT_TRUE(back.isOk()) << back.status().toString();
  EXPECT_EQ(back.value().toText(), p.toText());
  EXPECT_EQ(back.value().shape, "2x2");
  EXPECT_EQ(back.value().nsocks, 2);
  EXPECT_TRUE(back.value().inter.present);
  EXPECT_DOUBLE_EQ(back.value().inter.alphaUs, 61.25);
  EXPECT_DOUBLE_EQ(back.value().intra.nodeMBps, 3000);
  EXPECT_DOUBLE_EQ(back.value().inter.oneSocketMBps, 0);  // optional, and absent here
  ASSERT_EQ(back.value().codecs.size(), 2u);
  EXPECT_EQ(back.value().codecs[0].name, "int8");
  EXPECT_DOUBLE_EQ(back.value().codecs[0].accumulateMBps, 3000);
  EXPECT_TRUE(back.value().fits("2x2", "tcp", 2));
  EXPECT_FALSE(back.value().fits("2x2", "tcp", 1));
  EXPECT_FALSE(back.value().fits("2x1", "tcp", 2));
  EXPECT_FALSE(back.value().fits("2x2", "fabric", 2));
}

TEST(LinkProfileText, TheOneSocketRateRoundTrips) {
  LinkProfile p = sampleProfile();
  p.inter.oneSocketMBps = 116.5;
  const std::string text = p.toText();
  EXPECT_NE(text.find("inter_one_socket_MBps 116.5\n"), std::string::npos) << text;
  Result<LinkProfile> back = LinkProfile::parse(text, "test");
  ASSERT_TRUE(back.isOk()) << back.status().toString();
  EXPECT_DOUBLE_EQ(back.value().inter.oneSocketMBps, 116.5);
  EXPECT_EQ(back.value().toText(), text);
  const std::string without = sampleProfile().toText();
  for (const auto& [bad, why] : std::vector<std::pair<std::string, std::string>>{
           {"inter_one_socket_MBps 0", "expected a number > 0"},
           {"inter_one_socket_MBps x", "expected a number > 0"},
           {"inter_one_socket_MBps 5 node_MBps 5", "takes inter_one_socket_MBps"}}) {
    Result<LinkProfile> r = LinkProfile::parse(without + bad + "\n", "f.txt");
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(r.status().message().find(why), std::string::npos) << r.status().toString();
  }
  Result<LinkProfile> twice = LinkProfile::parse(text + "inter_one_socket_MBps 5\n", "f.txt");
  EXPECT_NE(twice.status().message().find("given twice"), std::string::npos);
  LinkProfile flat = sampleProfile();
  flat.inter = LinkClassProfile{};
  Result<LinkProfile> orphan =
      LinkProfile::parse(flat.toText() + "inter_one_socket_MBps 5\n", "f.txt");
  EXPECT_NE(orphan.status().message().find("with 'inter none'"), std::string::npos)
      << orphan.status().toString();
}

TEST(LinkProfileText, AbsentLinkClassesRoundTrip) {
  LinkProfile p = sampleProfile();
  p.intra = LinkClassProfile{};
  p.shape = "2x1";
  Result<LinkProfile> back = LinkProfile::parse(p.toText(), "test");
  ASSERT_TRUE(back.isOk()) << back.status().toString();
  EXPECT_FALSE(back.value().intra.present);
  EXPECT_NE(p.toText().find("intra none"), std::string::npos);
}

// Every malformed profile is refused with the place and the reason.
TEST(LinkProfileText, MalformedProfilesNameTheLineAndTheReason) {
  const std::string good = sampleProfile().toText();
  const auto replaced = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    const size_t at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return s.replace(at, from.size(), to);
  };
  struct Case {
    std::string text;
    std::string says;
  };
  const std::vector<Case> cases = {
      {replaced("version 1", "version 7"), "this nanoccl reads version 1"},
      {replaced("alpha_us 61.25", "alpha_us -3"), "expected a number > 0"},
      {replaced("alpha_us 61.25", "alpha_us nan"), "expected a number > 0"},
      {replaced("alpha_us 61.25", "alpha_us 1e999"), "expected a number > 0"},
      {replaced("alpha_us 61.25", "alpha_us 12abc"), "expected a number > 0"},
      {replaced("pair_MBps 117.5", "pair_MBps 117.5 pair_MBps 3"), "takes alpha_us"},
      {replaced("pair_MBps", "bandwidth"), "unexpected or repeated key 'bandwidth'"},
      {replaced("nsocks 2", "nsocks 0"), "expected an integer in [1, 64]"},
      {replaced("nsocks 2", "nsocks two"), "expected an integer in [1, 64]"},
      {replaced("shape 2x2", "shape 2x2 extra"), "'shape' takes one value"},
      {replaced("codec int8", "codec int9"), "unknown codec 'int9'"},
      {replaced("codec bf16", "codec int8"), "'codec int8' given twice"},
      {replaced("reduce_MBps", "reduce_GBps"), "unknown record 'reduce_GBps'"},
      {good + "shape 3x3\n", "'shape' given twice"},
      {replaced("cpu_share 0.5", "cpu_share 2"), "cpu_share 2: at most 1"},
      {replaced("intra alpha_us", "intra  # alpha_us"), "'intra' takes alpha_us"},
      {replaced("measured 2026-11-24T15:02:11Z\n", ""), "no 'measured' record"},
      {"", "no 'version' record (not a link profile?)"},
      {std::string("\x7f" "ELF\x02\x01\x01\0\0\0", 10), "unknown record"},
  };
  for (const Case& c : cases) {
    Result<LinkProfile> p = LinkProfile::parse(c.text, "/x/profile.txt");
    ASSERT_FALSE(p.isOk()) << c.says;
    EXPECT_EQ(p.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(p.status().message().find(c.says), std::string::npos) << p.status().toString();
    EXPECT_EQ(p.status().message().rfind("/x/profile.txt", 0), 0u) << p.status().toString();
  }
  // The line number: "version 7" is on line 2 (after the comment line).
  // (A missing record is named without one.)
  Result<LinkProfile> p = LinkProfile::parse(replaced("version 1", "version 7"), "f");
  EXPECT_EQ(p.status().message().rfind("f:2: ", 0), 0u) << p.status().toString();
}

TEST(LinkProfileFile, SavesLoadsAndSaysWhenAbsent) {
  TempDir dir;
  const std::string path = dir.path() + "/sub/profile.txt";
  Result<std::optional<LinkProfile>> none = loadProfile(path);
  ASSERT_TRUE(none.isOk()) << none.status().toString();
  EXPECT_FALSE(none.value().has_value());
  ASSERT_TRUE(saveProfile(sampleProfile(), path).isOk());
  struct stat st{};
  ASSERT_EQ(::stat((dir.path() + "/sub").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  Result<std::optional<LinkProfile>> back = loadProfile(path);
  ASSERT_TRUE(back.isOk()) << back.status().toString();
  ASSERT_TRUE(back.value().has_value());
  EXPECT_EQ(back.value()->toText(), sampleProfile().toText());
  // Missing directories are made; a path through a regular file cannot be.
  EXPECT_TRUE(saveProfile(sampleProfile(), dir.path() + "/a/b/c/p.txt").isOk());
  EXPECT_FALSE(saveProfile(sampleProfile(), path + "/p.txt").isOk());
}

// Rank 0 reads the file before anyone can go on: a FIFO, a device or a huge file would stall
// or flood the job, so only a small regular file is read.
TEST(LinkProfileFile, OnlyASmallRegularFileIsRead) {
  TempDir dir;
  const std::string fifo = dir.path() + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  Result<std::optional<LinkProfile>> p = loadProfile(fifo);
  ASSERT_FALSE(p.isOk());
  EXPECT_NE(p.status().message().find("not a regular file"), std::string::npos);
  const std::string big = dir.path() + "/big.txt";
  writeFile(big, sampleProfile().toText() + std::string(70000, '#'));
  p = loadProfile(big);
  ASSERT_FALSE(p.isOk());
  EXPECT_NE(p.status().message().find("larger than 64 KiB"), std::string::npos);
  // Codec names are read as the codec table spells them, once each whatever the case.
  std::string upper = sampleProfile().toText();
  upper.replace(upper.find("codec int8"), 10, "codec INT8");
  Result<LinkProfile> parsed = LinkProfile::parse(upper, "u");
  ASSERT_TRUE(parsed.isOk()) << parsed.status().toString();
  EXPECT_EQ(parsed.value().codecs[0].name, "int8");
  parsed = LinkProfile::parse(upper + "codec int8 encode_MBps 1 decode_MBps 1 accumulate_MBps 1\n",
                              "u");
  ASSERT_FALSE(parsed.isOk());
  EXPECT_NE(parsed.status().message().find("'codec int8' given twice"), std::string::npos)
      << parsed.status().toString();
}

TEST(LinkProfileFile, PathFollowsTheSettingThenTheCacheDirectory) {
  Config c;
  c.tuningFile = "/somewhere/p.txt";
  EXPECT_EQ(profilePath(c), "/somewhere/p.txt");
  c.tuningFile.clear();
  EXPECT_NE(profilePath(c).find("/nanoccl/link_profile.txt"), std::string::npos);
}

TEST(LinkProfileShape, NamesNodesTimesRanks) {
  EXPECT_EQ(shapeOf(Topology::fromNodeIds({"a", "a", "b", "b"})), "2x2");
  EXPECT_EQ(shapeOf(Topology::fromNodeIds({"a", "b"})), "2x1");
  EXPECT_EQ(shapeOf(Topology::fromNodeIds({"a", "a", "b"})), "2+1");
  EXPECT_EQ(shapeOf(Topology::singleNode(3)), "1x3");
}

TEST(CpuRates, EveryLossyCodecIsMeasured) {
  LinkProfile p;
  measureCpuRates(p);
  EXPECT_GT(p.reduceMBps, 0);
  std::vector<std::string> names;
  for (const CodecRates& c : p.codecs) {
    names.push_back(c.name);
    EXPECT_GT(c.encodeMBps, 0) << c.name;
    EXPECT_GT(c.decodeMBps, 0) << c.name;
    EXPECT_GT(c.accumulateMBps, 0) << c.name;
  }
  EXPECT_EQ(names, (std::vector<std::string>{"fp16", "bf16", "int8", "int4"}));
}

// ---- communicators ----------------------------------------------------------------------------

WorldOptions tunedWorld(std::vector<std::string> nodeIds, const std::string& mode,
                        const std::string& file) {
  WorldOptions o;
  o.size = static_cast<int>(nodeIds.size());
  o.nodeIds = std::move(nodeIds);
  o.configure = [mode, file](int, Config& c) {
    c.tuning = mode;
    c.tuningFile = file;
  };
  return o;
}

struct ShapeCase {
  std::vector<std::string> nodeIds;
  std::string shape;
  bool inter;
  bool intra;
};

class MeasuredProfile : public ::testing::TestWithParam<ShapeCase> {};

// Every rank ends with rank 0's profile; the link classes the topology has are measured, the
// others are said to be absent; rank 0 saved it; a call still runs afterwards.
TEST_P(MeasuredProfile, EveryRankHoldsRankZerosMeasurement) {
  const ShapeCase& c = GetParam();
  TempDir dir;
  const std::string file = dir.path() + "/p.txt";
  std::vector<std::shared_ptr<Communicator>> comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(tunedWorld(c.nodeIds, "measure", file), comms);
  ASSERT_NE(comms[0]->linkProfile(), nullptr);
  const LinkProfile& p = *comms[0]->linkProfile();
  for (const auto& comm : comms) {
    ASSERT_NE(comm->linkProfile(), nullptr);
    EXPECT_EQ(comm->linkProfile()->toText(), p.toText());
  }
  EXPECT_EQ(p.shape, c.shape);
  EXPECT_EQ(p.transport, "tcp");
  EXPECT_EQ(p.inter.present, c.inter);
  EXPECT_EQ(p.intra.present, c.intra);
  for (const LinkClassProfile* cls : {&p.inter, &p.intra}) {
    if (!cls->present) continue;
    EXPECT_GT(cls->alphaUs, 0);
    EXPECT_GT(cls->pairMBps, 0);
    EXPECT_GT(cls->nodeMBps, 0);
  }
  // Two connections a peer (the default): the one-socket probe ran too.
  EXPECT_EQ(p.inter.oneSocketMBps > 0, c.inter);
  EXPECT_EQ(p.intra.oneSocketMBps, 0);
  EXPECT_EQ(p.codecs.size(), 4u);
  EXPECT_GT(p.cpuShare, 0);
  EXPECT_LE(p.cpuShare, 1);
  EXPECT_EQ(readFile(file), p.toText());

  std::vector<float> data(4096, 1.0f);
  std::vector<std::vector<float>> bufs(comms.size(), data);
  std::vector<std::shared_ptr<Task>> tasks;
  for (size_t r = 0; r < comms.size(); ++r) {
    tasks.push_back(comms[r]->allreduce(bufs[r].data(), data.size(), DataType::kFloat32,
                                        ReduceOp::kSum));
  }
  colltest::expectAllOk(tasks);
  EXPECT_EQ(bufs[1][4095], static_cast<float>(comms.size()));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, MeasuredProfile,
    ::testing::Values(ShapeCase{{"a", "a", "b", "b"}, "2x2", true, true},
                      ShapeCase{{"a", "b"}, "2x1", true, false},
                      ShapeCase{{"a", "a", "b"}, "2+1", true, true},
                      ShapeCase{{"a", "b", "b"}, "1+2", true, true},
                      ShapeCase{{"a", "a", "a"}, "1x3", false, true}),
    [](const ::testing::TestParamInfo<ShapeCase>& info) {
      std::string n = info.param.shape;
      for (char& ch : n) {
        if (ch == '+') ch = 'p';
      }
      return "s" + n;
    });

TEST(TunedWorld, OffMeansNoProfileAndNoFile) {
  TempDir dir;
  const std::string file = dir.path() + "/p.txt";
  std::vector<std::shared_ptr<Communicator>> comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(tunedWorld({"a", "b"}, "off", file), comms);
  for (const auto& comm : comms) EXPECT_EQ(comm->linkProfile(), nullptr);
  EXPECT_NE(::access(file.c_str(), F_OK), 0);
}

// A profile saved long ago that fits a job of two ranks on two nodes with default settings.
LinkProfile savedFor2x1() {
  LinkProfile p = sampleProfile();
  p.shape = "2x1";
  p.nsocks = Config().nsocks;
  p.measured = "2020-01-01T00:00:00Z";
  return p;
}

// A file that fits the job is used as it is (nothing measured); one measured for another shape
// is measured again and replaced.
TEST(TunedWorld, CachedUsesAFittingFileAndReplacesAnother) {
  TempDir dir;
  const std::string file = dir.path() + "/p.txt";
  const LinkProfile fitting = savedFor2x1();
  ASSERT_TRUE(saveProfile(fitting, file).isOk());
  std::vector<std::shared_ptr<Communicator>> comms;
  NANOCCL_MAKE_WORLD_OR_SKIP(tunedWorld({"a", "b"}, "cached", file), comms);
  for (const auto& comm : comms) {
    ASSERT_NE(comm->linkProfile(), nullptr);
    EXPECT_EQ(comm->linkProfile()->toText(), fitting.toText());
  }
  comms.clear();

  NANOCCL_MAKE_WORLD_OR_SKIP(tunedWorld({"a", "a", "b", "b"}, "cached", file), comms);
  const LinkProfile& p = *comms[3]->linkProfile();
  EXPECT_EQ(p.shape, "2x2");
  EXPECT_NE(p.measured, fitting.measured);
  EXPECT_EQ(readFile(file), p.toText());
}

// Settings and files that cannot be honoured fail every rank, saying why.
TEST(TunedWorld, ABrokenFileFailsEveryRankNamingIt) {
  TempDir dir;
  const std::string file = dir.path() + "/p.txt";
  writeFile(file, sampleProfile().toText() + "bogus 1\n");
  for (const Result<std::shared_ptr<Communicator>>& r :
       createEach(tunedWorld({"a", "a", "b"}, "cached", file))) {
    ASSERT_FALSE(r.isOk());
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find(file + ":13: unknown record 'bogus'"), std::string::npos)
        << r.status().toString();
    EXPECT_NE(r.status().message().find("NANOCCL_TUNING=measure"), std::string::npos);
  }
}

TEST(TunedWorld, RanksThatDisagreeAboutTuningFailNamingTheSetting) {
  TempDir dir;
  WorldOptions o = tunedWorld({"a", "b", "b"}, "measure", dir.path() + "/p.txt");
  o.configure = [](int rank, Config& c) { c.tuning = rank == 2 ? "off" : "measure"; };
  for (const Result<std::shared_ptr<Communicator>>& r : createEach(o)) {
    ASSERT_FALSE(r.isOk());
    EXPECT_NE(r.status().message().find("rank 2 has NANOCCL_TUNING=off, rank 0 has "
                                        "NANOCCL_TUNING=measure"),
              std::string::npos)
        << r.status().toString();
  }
}

TEST(TunedWorld, TheSettingIsChecked) {
  Config c;
  EXPECT_TRUE(c.set("NANOCCL_TUNING", "cached").isOk());
  EXPECT_EQ(c.tuning, "cached");
  const Status bad = c.set("tuning", "sometimes");
  EXPECT_FALSE(bad.isOk());
  EXPECT_NE(bad.message().find("off|cached|measure"), std::string::npos) << bad.toString();
}

}  // namespace
}  // namespace nanoccl
