// JobControl in one process: a signal sets the request (and nothing else happens to the process),
// the handlers come back afterwards, one lives at a time, the restart facts come from the
// supervisor's variables with bad ones refused by name, and the heartbeat file says the steps.
#include <gpucloud/elastic/job_control.hpp>
#include <gpucloud/runtime/error.hpp>

#include <gtest/gtest.h>

#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <sys/wait.h>
#include <unistd.h>

namespace gc = gpucloud;
namespace el = gpucloud::elastic;

namespace {

// Sets (or unsets, for nullptr) an environment variable for one scope.
class EnvVar {
 public:
  EnvVar(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    if (value)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~EnvVar() {
    if (had_)
      ::setenv(name_.c_str(), old_.c_str(), 1);
    else
      ::unsetenv(name_.c_str());
  }

 private:
  std::string name_, old_;
  bool had_ = false;
};

int g_previous_handler_calls = 0;
extern "C" void previous_handler(int) { ++g_previous_handler_calls; }

}  // namespace

TEST(JobControl, ASignalRequestsAStopAndNothingElse) {
  el::JobControl control;
  EXPECT_FALSE(control.stop_requested());
  EXPECT_FALSE(control.should_stop(0));
  ASSERT_EQ(std::raise(SIGUSR1), 0);  // the default action would end the process
  EXPECT_TRUE(control.stop_requested());
  EXPECT_EQ(control.stop_signal(), SIGUSR1);
  ASSERT_EQ(std::raise(SIGTERM), 0);          // a second signal, as during the save: still alive
  EXPECT_EQ(control.stop_signal(), SIGUSR1);  // the first one is the one reported
  EXPECT_TRUE(control.should_stop(1));
  EXPECT_EQ(control.first_step(), 0);
}

TEST(JobControl, RequestStopWithoutASignal) {
  el::JobControl control;
  control.request_stop();
  EXPECT_TRUE(control.should_stop(7));
  EXPECT_EQ(control.stop_signal(), 0);
  EXPECT_EQ(control.first_step(), 7);
}

TEST(JobControl, ThePreviousHandlersComeBack) {
  struct sigaction act {
  }, old{};
  act.sa_handler = previous_handler;
  sigemptyset(&act.sa_mask);
  ASSERT_EQ(sigaction(SIGUSR2, &act, &old), 0);
  g_previous_handler_calls = 0;
  {
    el::JobControlOptions o;
    o.signals = {SIGUSR2};
    el::JobControl control(o);
    std::raise(SIGUSR2);
    EXPECT_TRUE(control.stop_requested());
    EXPECT_EQ(g_previous_handler_calls, 0);
  }
  std::raise(SIGUSR2);
  EXPECT_EQ(g_previous_handler_calls, 1);
  sigaction(SIGUSR2, &old, nullptr);
  el::JobControl fresh;  // a new one starts without a request
  EXPECT_FALSE(fresh.stop_requested());
}

TEST(JobControl, OneAtATimeAndCatchableSignalsOnly) {
  {
    el::JobControl control;
    EXPECT_THROW(el::JobControl second, gc::InvalidArgument);
  }
  for (int bad : {SIGKILL, SIGSTOP, 0, -3, NSIG}) {
    el::JobControlOptions o;
    o.signals = {SIGTERM, bad};
    try {
      el::JobControl control(o);
      ADD_FAILURE() << "signal " << bad << " accepted";
    } catch (const gc::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("signal " + std::to_string(bad) + " cannot be caught"), std::string::npos)
          << e.what();
    }
  }
  el::JobControl after;  // nothing was left installed or marked alive by the refusals
  EXPECT_FALSE(after.stop_requested());
}

TEST(JobControl, RestartFactsFromTheSupervisor) {
  {
    EnvVar a("GPUCLOUD_RESTART_COUNT", nullptr), b("TORCHELASTIC_RESTART_COUNT", nullptr),
        c("SLURM_RESTART_COUNT", nullptr);
    EXPECT_EQ(el::restart_info_from_environment().count, 0);
    EXPECT_EQ(el::restart_info_from_environment().reason, "");
  }
  {
    EnvVar a("GPUCLOUD_RESTART_COUNT", "2"), b("GPUCLOUD_RESTART_REASON", "rank 1 killed by SIGKILL"),
        c("TORCHELASTIC_RESTART_COUNT", "5");
    el::JobControl control;
    EXPECT_EQ(control.restart().count, 2);
    EXPECT_EQ(control.restart().reason, "rank 1 killed by SIGKILL");
  }
  {
    EnvVar a("GPUCLOUD_RESTART_COUNT", nullptr), b("TORCHELASTIC_RESTART_COUNT", "3");
    EXPECT_EQ(el::restart_info_from_environment().count, 3);
  }
  {
    EnvVar a("GPUCLOUD_RESTART_COUNT", nullptr), b("TORCHELASTIC_RESTART_COUNT", nullptr),
        c("SLURM_RESTART_COUNT", "1");
    EXPECT_EQ(el::restart_info_from_environment().reason, "requeued by Slurm");
  }
  for (const char* bad : {"-1", "two", "3x", "99999999999"}) {
    EnvVar a("GPUCLOUD_RESTART_COUNT", bad);
    try {
      el::JobControl control;
      ADD_FAILURE() << bad << " accepted";
    } catch (const gc::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("GPUCLOUD_RESTART_COUNT='" + std::string(bad) + "'"), std::string::npos)
          << e.what();
    }
  }
}

TEST(JobControl, TheHeartbeatSaysTheFirstAndLatestStep) {
  const auto dir = std::filesystem::temp_directory_path() / ("gpucloud-heartbeat-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  {
    EnvVar run_dir("GPUCLOUD_RUN_DIR", dir.c_str());
    el::JobControl control;
    control.should_stop(40);
    std::ifstream f(dir / "rank-0");
    long long first = -1, latest = -1;
    double first_time = 0, latest_time = 0;
    int pid = 0;
    f >> first >> latest >> first_time >> latest_time >> pid;
    EXPECT_EQ(first, 40);
    EXPECT_EQ(latest, 40);
    EXPECT_GT(first_time, 1.0e9);  // seconds since the epoch
    EXPECT_GE(latest_time, first_time);
    EXPECT_EQ(pid, ::getpid());
    control.should_stop(41);
    std::ifstream g(dir / "rank-0");
    g >> first >> latest;
    EXPECT_EQ(first, 40);
    EXPECT_EQ(latest, 41);
  }
  std::filesystem::remove_all(dir);
  {
    EnvVar run_dir("GPUCLOUD_RUN_DIR", "/nonexistent/gpucloud-run");  // reported, training goes on
    el::JobControl control;
    EXPECT_FALSE(control.should_stop(1));
  }
}

TEST(JobControl, SignalsFromTheEnvironment) {
  {
    EnvVar v("GPUCLOUD_STOP_SIGNALS", "USR2,SIGHUP");
    el::JobControl control;
    ASSERT_EQ(std::raise(SIGHUP), 0);  // caught: the default action would end the process
    EXPECT_EQ(control.stop_signal(), SIGHUP);
  }
  {
    EnvVar v("GPUCLOUD_STOP_SIGNALS", "12");  // SIGUSR2 by number
    el::JobControl control;
    ASSERT_EQ(std::raise(SIGUSR2), 0);
    EXPECT_EQ(control.stop_signal(), SIGUSR2);
  }
  {
    EnvVar v("GPUCLOUD_STOP_SIGNALS", "none");
    el::JobControl control;  // no handler: SIGUSR1 keeps its previous disposition
    struct sigaction now {};
    sigaction(SIGUSR1, nullptr, &now);
    EXPECT_EQ(now.sa_handler, SIG_DFL);
  }
  {
    EnvVar v("GPUCLOUD_STOP_SIGNALS", "USR2");
    el::JobControlOptions o;
    o.signals_from_environment = false;  // the trainer's own choice wins
    o.signals = {SIGHUP};
    el::JobControl control(o);
    struct sigaction now {};
    sigaction(SIGUSR2, nullptr, &now);
    EXPECT_EQ(now.sa_handler, SIG_DFL);
  }
  for (const char* bad : {"TERM,BOGUS", "USR1,", "KILL"}) {
    EnvVar v("GPUCLOUD_STOP_SIGNALS", bad);
    try {
      el::JobControl control;
      ADD_FAILURE() << bad << " accepted";
    } catch (const gc::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(std::string(bad) == "KILL" ? "cannot be caught" : "GPUCLOUD_STOP_SIGNALS"),
                std::string::npos)
          << e.what();
    }
  }
}

namespace {
// Field @p i of a heartbeat line (0 first step, 1 latest step, ..., 5 state).
std::string heartbeat_field(const std::filesystem::path& file, int i) {
  std::ifstream f(file);
  std::string field;
  for (int k = 0; k <= i; ++k) f >> field;
  return field;
}
std::string heartbeat_state(const std::filesystem::path& file) { return heartbeat_field(file, 5); }
}  // namespace

TEST(JobControl, TheHeartbeatSaysClosedAfterExitWithoutTheDestructor) {
  const auto dir = std::filesystem::temp_directory_path() / ("gpucloud-exit-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // exit() skips the destructor of a local: the atexit hook marks it closed
    ::setenv("GPUCLOUD_RUN_DIR", dir.c_str(), 1);
    static el::JobControl* leaked = new el::JobControl();
    leaked->should_stop(3);
    std::exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(heartbeat_field(dir / "rank-0", 1), "3");  // the latest step
  EXPECT_EQ(heartbeat_state(dir / "rank-0"), "x");
  std::filesystem::remove_all(dir);
}

TEST(JobControl, TheHeartbeatSaysFailedWhenAnErrorEndsIt) {
  const auto dir = std::filesystem::temp_directory_path() / ("gpucloud-failed-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  EnvVar run_dir("GPUCLOUD_RUN_DIR", dir.c_str());
  {
    el::JobControl control;
    control.should_stop(5);
    EXPECT_EQ(heartbeat_state(dir / "rank-0"), "r");
  }
  EXPECT_EQ(heartbeat_state(dir / "rank-0"), "x");  // a normal end
  try {
    el::JobControl control;
    control.should_stop(6);
    throw gc::CommunicationError("all_reduce", "a peer is gone", __FILE__, __LINE__);
  } catch (const gc::CommunicationError&) {
  }
  EXPECT_EQ(heartbeat_state(dir / "rank-0"), "e");  // unwound by the error
  {
    el::JobControl control;
    control.should_stop(7);
    control.mark_failed();  // a trainer that handles its error itself, then ends
    EXPECT_EQ(heartbeat_state(dir / "rank-0"), "r");
  }
  EXPECT_EQ(heartbeat_state(dir / "rank-0"), "e");
  std::filesystem::remove_all(dir);
}
