// The out-of-band job secret: what is accepted, and every way a secret file is refused.
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "common/secret.h"

namespace nanoccl {
namespace {

class SecretFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/nanoccl-secret-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }

  std::string write(const std::string& name, const std::string& content, mode_t mode) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << content;
    chmod(path.c_str(), mode);
    return path;
  }

  Result<JobSecret> load(const std::string& path) {
    Config c;
    c.secretFile = path;
    return loadOutOfBandSecret(c);
  }

  std::string dir_;
};

TEST_F(SecretFileTest, AFileOnlyTheUserCanReadGivesTheSecretWithoutItsNewline) {
  auto js = load(write("s", "0123456789abcdef0123\n", 0600));
  ASSERT_TRUE(js.isOk()) << js.status().toString();
  EXPECT_TRUE(js->outOfBand);
  EXPECT_EQ(js->bytes, "0123456789abcdef0123");
  EXPECT_NE(js->where.find("NANOCCL_SECRET_FILE="), std::string::npos);
  EXPECT_EQ(jobKey(js->bytes), jobKey("0123456789abcdef0123"));
  EXPECT_NE(jobKey(js->bytes), jobKey("0123456789abcdef0124"));
}

TEST_F(SecretFileTest, LoosePermissionsAreRefusedNamingTheMode) {
  for (mode_t mode : {0640, 0604, 0660, 0644, 0620}) {
    const auto js = load(write("s", "0123456789abcdef0123", mode));
    ASSERT_EQ(js.status().code(), StatusCode::kInvalidArgument) << std::oct << mode;
    EXPECT_NE(js.status().message().find("chmod 600"), std::string::npos)
        << js.status().message();
  }
  const auto js = load(write("s", "0123456789abcdef0123", 0644));
  EXPECT_NE(js.status().message().find("mode 0644"), std::string::npos) << js.status().message();
}

TEST_F(SecretFileTest, MissingShortLinkedAndNonRegularFilesAreRefused) {
  EXPECT_EQ(load(dir_ + "/nope").status().code(), StatusCode::kInvalidArgument);
  const auto shortOne = load(write("short", "tooshort\n", 0600));
  ASSERT_EQ(shortOne.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(shortOne.status().message().find("at least 16"), std::string::npos);
  const std::string target = write("target", "0123456789abcdef0123", 0600);
  ASSERT_EQ(symlink(target.c_str(), (dir_ + "/link").c_str()), 0);
  const auto linked = load(dir_ + "/link");
  ASSERT_EQ(linked.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(linked.status().message().find("symbolic link"), std::string::npos)
      << linked.status().message();
  chmod(dir_.c_str(), 0700);
  const auto directory = load(dir_);
  ASSERT_EQ(directory.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(directory.status().message().find("not a regular file"), std::string::npos)
      << directory.status().message();
  const auto huge = load(write("huge", std::string(8192, 'x'), 0600));
  EXPECT_EQ(huge.status().code(), StatusCode::kInvalidArgument);
}

TEST(SecretSettings, TheValueItselfWorksTooAndBothAtOnceIsAnError) {
  Config c;
  auto none = loadOutOfBandSecret(c);
  ASSERT_TRUE(none.isOk());
  EXPECT_FALSE(none->outOfBand);
  c.secret = "a-secret-of-twenty-bytes";
  auto env = loadOutOfBandSecret(c);
  ASSERT_TRUE(env.isOk());
  EXPECT_TRUE(env->outOfBand);
  EXPECT_EQ(env->where, "NANOCCL_SECRET");
  c.secret = "short";
  EXPECT_EQ(loadOutOfBandSecret(c).status().code(), StatusCode::kInvalidArgument);
  c.secret = "a-secret-of-twenty-bytes";
  c.secretFile = "/nonexistent";
  const auto both = loadOutOfBandSecret(c);
  ASSERT_EQ(both.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(both.status().message().find("both"), std::string::npos);
}

TEST(SecretSettings, TheSecretIsNeverPrinted) {
  Config c;
  ASSERT_TRUE(c.set("NANOCCL_SECRET", "do-not-print-me-please").isOk());
  ASSERT_TRUE(c.set("encrypt", "1").isOk());
  for (const auto& [k, v] : c.items()) {
    EXPECT_EQ(v.find("do-not-print"), std::string::npos) << k;
  }
  EXPECT_TRUE(c.encrypt);
  EXPECT_EQ(c.set("encrypt", "yes").code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace nanoccl
