// The straggler detection's side channel (src/telemetry/straggler_channel): ranks as channels in
// one process, or as child processes where a rank dies; strangers, garbage, slow readers.
// Internal: compiled into the test.
#include <gtest/gtest.h>

#include "telemetry/straggler_channel.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <future>
#include <optional>
#include <thread>
#include <vector>

namespace {

using gpucloud::telemetry::detail::RankSummary;
using gpucloud::telemetry::detail::Rendezvous;
using gpucloud::telemetry::detail::StragglerChannel;
using gpucloud::telemetry::detail::SummaryTable;

// Rank 0 and size - 1 joined peers, set up as detect_stragglers does (joins run beside the accept).
struct Job {
  StragglerChannel host;
  std::vector<StragglerChannel> peers;
};

Job make_job(int size) {
  Rendezvous where;
  Job job{StragglerChannel::host(size, where), {}};
  std::vector<std::future<StragglerChannel>> joins;
  for (int r = 1; r < size; ++r) {
    joins.push_back(std::async(std::launch::async, [=] { return StragglerChannel::join(r, size, where, 20.0); }));
  }
  EXPECT_TRUE(job.host.accept_peers(20.0)) << job.host.error();
  for (auto& j : joins) {
    job.peers.push_back(j.get());
    EXPECT_TRUE(job.peers.back().joined()) << job.peers.back().error();
  }
  return job;
}

// Polls @p c until a table comes (bounded: a channel that never delivers fails the test).
SummaryTable next_table(StragglerChannel& c) {
  for (int i = 0; i < 20000; ++i) {
    if (auto t = c.poll()) return *t;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ADD_FAILURE() << "no table on rank " << c.rank();
  return {};
}

// A raw client of rank 0's port: what a stranger on the network can do.
int raw_connect(const Rendezvous& where) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<std::uint16_t>(where.words[1]));
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)), 0) << std::strerror(errno);
  return fd;
}

TEST(StragglerChannel, RanksWithUnequalStepCountsEachGiveTheirLatestPeriod) {
  Job job = make_job(3);
  // Rank 2 is slow and completes one period while the others complete three.
  job.host.publish({0.010, 0.008, 10});
  job.peers[0].publish({0.010, 0.008, 10});
  job.peers[1].publish({0.030, 0.028, 10});
  job.host.publish({0.011, 0.009, 30});
  job.peers[0].publish({0.012, 0.007, 30});
  SummaryTable t;
  do {  // until rank 0 has heard the latest of every rank
    t = next_table(job.host);
  } while (t.ranks[1].steps != 30 || t.ranks[2].steps != 10);
  EXPECT_EQ(t.ranks[0].steps, 30);
  EXPECT_DOUBLE_EQ(t.ranks[0].compute_seconds, 0.009);
  EXPECT_DOUBLE_EQ(t.ranks[1].compute_seconds, 0.007);
  EXPECT_DOUBLE_EQ(t.ranks[2].compute_seconds, 0.028);
  EXPECT_DOUBLE_EQ(t.ranks[2].step_seconds, 0.030);
  EXPECT_EQ(t.lost, std::vector<bool>(3, false));
  // Every other rank receives rank 0's tables; the last one it got is the newest.
  for (auto& peer : job.peers) {
    SummaryTable seen;
    do {
      seen = next_table(peer);
    } while (seen.ranks[1].steps != 30 || seen.ranks[2].steps != 10);
    EXPECT_DOUBLE_EQ(seen.ranks[2].compute_seconds, 0.028);
  }
}

TEST(StragglerChannel, NoTableUntilEveryRankHasReported) {
  Job job = make_job(3);
  job.host.publish({0.01, 0.01, 5});
  job.peers[0].publish({0.01, 0.01, 5});
  for (int i = 0; i < 50; ++i) {
    EXPECT_FALSE(job.host.poll().has_value());
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  job.peers[1].publish({0.02, 0.02, 5});
  EXPECT_EQ(next_table(job.host).ranks[2].steps, 5);
}

TEST(StragglerChannel, AOneRankJobNeedsNoNetwork) {
  Rendezvous where;
  StragglerChannel c = StragglerChannel::host(1, where);
  EXPECT_TRUE(c.joined());
  EXPECT_EQ(where.words[1], 0) << "a job of one rank listens on no port";
  c.publish({0.5, 0.4, 7});
  const auto t = c.poll();
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->ranks.at(0).steps, 7);
  EXPECT_FALSE(c.poll().has_value()) << "nothing new";
}

TEST(StragglerChannel, StrangersAndWrongTokensAreTurnedAway) {
  Rendezvous where;
  StragglerChannel host = StragglerChannel::host(2, where);
  // A stranger that says nothing, one with garbage, one with the wrong token, one claiming rank 0.
  const int silent = raw_connect(where);
  const int garbage = raw_connect(where);
  const char junk[] = "GET /metrics HTTP/1.1\r\n\r\n";
  ASSERT_GT(::send(garbage, junk, sizeof(junk), 0), 0);
  Rendezvous forged = where;
  forged.words[0] ^= 1;
  auto wrong = std::async(std::launch::async, [=] { return StragglerChannel::join(1, 2, forged, 3.0); });
  Rendezvous as_zero = where;
  auto zero = std::async(std::launch::async, [=] { return StragglerChannel::join(0, 2, as_zero, 3.0); });
  auto real = std::async(std::launch::async, [=] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    return StragglerChannel::join(1, 2, where, 20.0);
  });
  EXPECT_TRUE(host.accept_peers(20.0)) << host.error();
  StragglerChannel w = wrong.get(), z = zero.get(), r = real.get();
  EXPECT_FALSE(w.joined());
  EXPECT_NE(w.error().find("rank 1 could not reach rank 0 at"), std::string::npos) << w.error();
  EXPECT_FALSE(z.joined());
  EXPECT_TRUE(r.joined()) << r.error();
  ::close(silent);
  ::close(garbage);
}

TEST(StragglerChannel, RankZeroNamesTheRanksThatNeverCame) {
  Rendezvous where;
  StragglerChannel host = StragglerChannel::host(4, where);
  auto one = std::async(std::launch::async, [=] { return StragglerChannel::join(1, 4, where, 20.0); });
  EXPECT_FALSE(host.accept_peers(1.0));
  EXPECT_NE(host.error().find("rank(s) 2, 3"), std::string::npos) << host.error();
  EXPECT_TRUE(one.get().joined());
}

TEST(StragglerChannel, AnUnreachableRankZeroIsAnErrorNamingTheAddress) {
  Rendezvous where;
  { StragglerChannel host = StragglerChannel::host(2, where); }  // closed: nobody listens on the port now
  const StragglerChannel c = StragglerChannel::join(1, 2, where, 5.0);
  EXPECT_FALSE(c.joined());
  EXPECT_NE(c.error().find("127.0.0.1:" + std::to_string(where.words[1])), std::string::npos) << c.error();
}

TEST(StragglerChannel, GarbageAfterSetupLosesThatRankOnly) {
  Rendezvous where;
  StragglerChannel host = StragglerChannel::host(3, where);
  // Rank 1 is a raw socket that knows the handshake (the token leaked), then sends garbage.
  const int raw = raw_connect(where);
  std::uint32_t hello_magic = 0x31484347;
  std::int32_t who = 1;
  char hello[16];
  std::memcpy(hello, &hello_magic, 4);
  std::memcpy(hello + 4, &who, 4);
  std::memcpy(hello + 8, &where.words[0], 8);
  ASSERT_EQ(::send(raw, hello, sizeof(hello), 0), 16);
  auto two = std::async(std::launch::async, [=] { return StragglerChannel::join(2, 3, where, 20.0); });
  ASSERT_TRUE(host.accept_peers(20.0)) << host.error();
  StragglerChannel rank2 = two.get();
  char welcome[16];
  ASSERT_EQ(::recv(raw, welcome, sizeof(welcome), MSG_WAITALL), 16);
  char junk[64];
  std::memset(junk, 0x5a, sizeof(junk));
  ASSERT_EQ(::send(raw, junk, sizeof(junk), 0), 64);
  host.publish({0.01, 0.01, 10});
  rank2.publish({0.01, 0.02, 10});
  SummaryTable t;
  do {  // rank 1 never sent a summary: the table comes once it is lost
    t = next_table(host);
  } while (!t.lost[1] || t.ranks[2].steps != 10);
  EXPECT_FALSE(t.lost[2]);
  EXPECT_DOUBLE_EQ(t.ranks[2].compute_seconds, 0.02);
  char byte;
  EXPECT_EQ(::recv(raw, &byte, 1, 0), 0) << "rank 0 closed the garbage's connection";
  ::close(raw);
}

TEST(StragglerChannel, AReaderThatNeverReadsDoesNotBlockRankZero) {
  Job job = make_job(2);
  // Rank 1 never polls: rank 0's tables fill its socket, then are dropped; rank 0 never waits.
  job.peers[0].publish({0.01, 0.01, 1});
  job.host.publish({0.01, 0.01, 0});
  (void)next_table(job.host);
  for (int i = 0; i < 20000; ++i) {
    job.host.publish({0.01, 0.01, i});
    (void)job.host.poll();
  }
  // Rank 1 reads at last: it gets tables, then the newest.
  job.host.publish({0.01, 0.01, 99999});
  (void)job.host.poll();
  std::int64_t last = -1;
  for (int i = 0; i < 20000 && last != 99999; ++i) {
    if (auto t = job.peers[0].poll()) last = t->ranks[0].steps;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
    if (i % 16 == 0) {  // rank 0 goes on: its queue drains as rank 1 reads, and new tables get through
      job.host.publish({0.01, 0.01, 99999});
      (void)job.host.poll();
    }
  }
  EXPECT_EQ(last, 99999);
}

TEST(StragglerChannel, ARankKilledMidRunIsReportedLost) {
  Rendezvous where;
  StragglerChannel host = StragglerChannel::host(3, where);
  std::vector<pid_t> children;
  for (int r = 1; r < 3; ++r) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {  // a rank in its own process: publishes, then rank 2 is killed, rank 1 runs on
      StragglerChannel c = StragglerChannel::join(r, 3, where, 20.0);
      if (!c.joined()) ::_exit(3);
      c.publish({0.01, 0.01 * r, 10});
      if (r == 2) {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        ::raise(SIGKILL);
      }
      for (int i = 0; i < 400; ++i) {  // a few seconds of steps
        c.publish({0.01, 0.01, 20 + i});
        (void)c.poll();
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      ::_exit(0);
    }
    children.push_back(pid);
  }
  ASSERT_TRUE(host.accept_peers(20.0)) << host.error();
  host.publish({0.01, 0.01, 10});
  SummaryTable t;
  do {
    t = next_table(host);
  } while (!t.lost[2]);
  EXPECT_FALSE(t.lost[1]);
  host.publish({0.01, 0.01, 11});
  do {
    t = next_table(host);
  } while (t.ranks[1].steps < 25);
  EXPECT_TRUE(t.lost[2]);
  int status = 0;
  ASSERT_EQ(::waitpid(children[1], &status, 0), children[1]);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
  ASSERT_EQ(::waitpid(children[0], &status, 0), children[0]);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
}

TEST(StragglerChannel, RanksOutliveRankZero) {
  Job job = make_job(2);
  job.peers[0].publish({0.01, 0.01, 1});
  job.host.publish({0.01, 0.01, 1});
  (void)next_table(job.host);
  job.host = StragglerChannel::join(1, 2, Rendezvous{}, 0.1);  // rank 0 ends: its channel closes
  for (int i = 0; i < 100; ++i) {                              // rank 1 goes on recording: nothing raises or blocks
    job.peers[0].publish({0.01, 0.01, 2 + i});
    (void)job.peers[0].poll();
  }
  SUCCEED();
}

}  // namespace
