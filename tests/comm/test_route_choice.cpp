// The MPI backend's route chooser (src/comm/mpi/route_choice): rank 0's measured choice between
// the library's polled schedules and MPI's own nonblocking collectives, and where it applies. Internal: compiled into
// the test; timings are given, not measured, so every decision is checked exactly.
#include <gtest/gtest.h>

#include <gpucloud/runtime/error.hpp>

#include "comm/mpi/route_choice.hpp"

#include <cstdlib>

namespace {

using gpucloud::detail::Collective;
using gpucloud::detail::Route;
using gpucloud::detail::RouteChooser;

constexpr std::size_t kBytes = std::size_t{4} << 20;

// Runs @p calls collectives, each route taking the given seconds; returns how many took MPI's route.
int run(RouteChooser& c, int calls, double schedule_s, double mpi_s, Collective kind = Collective::all_reduce,
        std::size_t bytes = kBytes) {
  int mpi = 0;
  for (int i = 0; i < calls; ++i) {
    const Route r = c.pick(kind, bytes);
    mpi += r == Route::mpi ? 1 : 0;
    c.record(kind, bytes, r, r == Route::mpi ? mpi_s : schedule_s);
  }
  return mpi;
}

TEST(RouteChooser, AlternatesUntilBothAreTimedThenTakesTheFaster) {
  RouteChooser c;
  // Each route's first call untimed, then kWarmUp timings each: 2 x (1 + 3) calls alternate.
  for (int i = 0; i < 2 * (1 + RouteChooser::kWarmUp); ++i) {
    const Route r = c.pick(Collective::all_reduce, kBytes);
    EXPECT_EQ(r, i % 2 == 0 ? Route::schedule : Route::mpi) << i;
    c.record(Collective::all_reduce, kBytes, r, r == Route::mpi ? 1e-3 : 3e-3);
  }
  ASSERT_EQ(c.chosen(Collective::all_reduce, kBytes), Route::mpi);
  EXPECT_EQ(run(c, RouteChooser::kFirstProbe - 1, 3e-3, 1e-3), static_cast<int>(RouteChooser::kFirstProbe - 1));
}

TEST(RouteChooser, ProbesTheSlowerRouteLessOftenWhileItStaysSlower) {
  RouteChooser c;
  run(c, 8, 1e-3, 2e-3);
  ASSERT_EQ(c.chosen(Collective::broadcast, kBytes), std::nullopt);  // other classes untouched
  ASSERT_EQ(c.chosen(Collective::all_reduce, kBytes), Route::schedule);
  // Probes at 64, then 128, 256, ... calls apart: 4 in 64 + 128 + 256 + 512 calls.
  EXPECT_EQ(run(c, 64 + 128 + 256 + 512, 1e-3, 2e-3), 4);
  EXPECT_EQ(c.chosen(Collective::all_reduce, kBytes), Route::schedule);
}

TEST(RouteChooser, SwitchesWhenTheOtherRouteBecomesFaster) {
  RouteChooser c;
  run(c, 8, 1e-3, 2e-3);
  ASSERT_EQ(c.chosen(Collective::all_reduce, kBytes), Route::schedule);
  // The schedule slows down 1.5x (below the re-measuring threshold); MPI's route is now 2x faster
  // than it was: the probes find it, and once its mean wins it is taken.
  const int mpi = run(c, 2000, 1.5e-3, 1e-3);
  EXPECT_GT(mpi, 0);
  EXPECT_EQ(c.chosen(Collective::all_reduce, kBytes), Route::mpi);
  EXPECT_GT(run(c, 100, 1.5e-3, 1e-3), 95);
}

TEST(RouteChooser, ABusierMachineMeasuresTheOtherRouteAfresh) {
  RouteChooser c;
  run(c, 8, 1e-3, 2e-3);
  ASSERT_EQ(c.chosen(Collective::all_reduce, kBytes), Route::schedule);
  run(c, 100, 1e-3, 2e-3);
  // Competitors arrive: the schedule takes 10 ms, MPI's route 4 ms. Once the schedule's mean has
  // more than doubled (and 64 calls passed since the choice) MPI's route is timed afresh,
  // kWarmUp calls, and wins.
  const int mpi = run(c, 100, 10e-3, 4e-3);
  EXPECT_GE(mpi, RouteChooser::kWarmUp);
  EXPECT_EQ(c.chosen(Collective::all_reduce, kBytes), Route::mpi);
}

TEST(RouteChooser, SizeClassesArePowersOfTwoPerCollective) {
  RouteChooser c;
  run(c, 8, 1e-3, 2e-3, Collective::all_gather, std::size_t{3} << 20);
  EXPECT_EQ(c.chosen(Collective::all_gather, std::size_t{4} << 20), Route::schedule);  // same class: (2, 4] MiB
  EXPECT_EQ(c.chosen(Collective::all_gather, std::size_t{2} << 20), std::nullopt);
  EXPECT_EQ(c.chosen(Collective::reduce_scatter, std::size_t{4} << 20), std::nullopt);
}

TEST(RouteChooser, TheEnvironmentPicksAPolicyOrNamesItsMistake) {
  using gpucloud::detail::route_policy_from_environment;
  using gpucloud::detail::RoutePolicy;
  ::unsetenv("GPUCLOUD_COLLECTIVE_ROUTE");
  EXPECT_EQ(route_policy_from_environment(), RoutePolicy::automatic);
  ::setenv("GPUCLOUD_COLLECTIVE_ROUTE", "auto", 1);
  EXPECT_EQ(route_policy_from_environment(), RoutePolicy::automatic);
  ::setenv("GPUCLOUD_COLLECTIVE_ROUTE", "fastest", 1);
  EXPECT_EQ(route_policy_from_environment(), RoutePolicy::fastest);
  ::setenv("GPUCLOUD_COLLECTIVE_ROUTE", "mpi", 1);
  EXPECT_EQ(route_policy_from_environment(), RoutePolicy::mpi);
  ::setenv("GPUCLOUD_COLLECTIVE_ROUTE", "schedule", 1);
  EXPECT_EQ(route_policy_from_environment(), RoutePolicy::schedule);
  ::setenv("GPUCLOUD_COLLECTIVE_ROUTE", "ring", 1);
  try {
    (void)route_policy_from_environment();
    ADD_FAILURE() << "no error";
  } catch (const gpucloud::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("GPUCLOUD_COLLECTIVE_ROUTE: 'ring'"), std::string::npos) << e.what();
  }
  ::unsetenv("GPUCLOUD_COLLECTIVE_ROUTE");
}

// By default a sum over 3 or more ranks keeps one route (the two add in different orders), so a
// rerun reproduces it bit for bit; data movement and 2-rank sums (a + b == b + a) are measured.
TEST(RouteChooser, ByDefaultSumsOverThreeOrMoreRanksKeepOneRoute) {
  using gpucloud::detail::routed;
  using gpucloud::detail::RoutePolicy;
  EXPECT_TRUE(routed(RoutePolicy::automatic, Collective::all_reduce, 2));
  EXPECT_TRUE(routed(RoutePolicy::automatic, Collective::reduce_scatter, 2));
  EXPECT_FALSE(routed(RoutePolicy::automatic, Collective::all_reduce, 3));
  EXPECT_FALSE(routed(RoutePolicy::automatic, Collective::reduce_scatter, 4));
  EXPECT_TRUE(routed(RoutePolicy::automatic, Collective::all_gather, 4));
  EXPECT_TRUE(routed(RoutePolicy::automatic, Collective::broadcast, 8));
  EXPECT_TRUE(routed(RoutePolicy::fastest, Collective::all_reduce, 4));
  EXPECT_TRUE(routed(RoutePolicy::mpi, Collective::reduce_scatter, 3));
}

// Where a sum's other route is the direct all-reduce or reduce-scatter, which adds as the ring
// does, the default measures both: a rerun reproduces its sums whichever runs.
TEST(RouteChooser, SumsWhoseOtherRouteAddsAsTheRingAreMeasured) {
  using gpucloud::detail::routed;
  using gpucloud::detail::RoutePolicy;
  EXPECT_TRUE(routed(RoutePolicy::automatic, Collective::all_reduce, 3, Route::direct));
  EXPECT_TRUE(routed(RoutePolicy::automatic, Collective::all_reduce, 16, Route::direct));
  EXPECT_TRUE(routed(RoutePolicy::automatic, Collective::reduce_scatter, 4, Route::direct));
  EXPECT_FALSE(routed(RoutePolicy::automatic, Collective::all_reduce, 3, Route::mpi));
  RouteChooser c;
  int direct = 0;
  for (int i = 0; i < 2 * (1 + RouteChooser::kWarmUp) + 10; ++i) {
    const Route r = c.pick(Collective::all_reduce, kBytes, Route::direct);
    ASSERT_NE(r, Route::mpi);
    direct += r == Route::direct ? 1 : 0;
    c.record(Collective::all_reduce, kBytes, r, r == Route::direct ? 1e-3 : 3e-3, Route::direct);
  }
  EXPECT_EQ(direct, 1 + RouteChooser::kWarmUp + 10);
  EXPECT_EQ(c.chosen(Collective::all_reduce, kBytes, Route::direct), Route::direct);
  // A class per other route: the same size against MPI's route is not measured yet.
  EXPECT_EQ(c.chosen(Collective::all_reduce, kBytes, Route::mpi), std::nullopt);
}

// A 2-rank broadcast's root, and both ranks of a 2-rank all-gather or all-reduce up to 16 MiB,
// send their data with the agreement, before rank 0's route could reach them: their call sites
// give no other route (Route::schedule), which is one route under every policy.
TEST(RouteChooser, CollectivesWithoutAnotherRouteHaveOne) {
  using gpucloud::detail::routed;
  using gpucloud::detail::RoutePolicy;
  for (RoutePolicy p : {RoutePolicy::automatic, RoutePolicy::fastest, RoutePolicy::schedule, RoutePolicy::mpi}) {
    EXPECT_FALSE(routed(p, Collective::broadcast, 2, Route::schedule));
    EXPECT_FALSE(routed(p, Collective::all_gather, 2, Route::schedule));
    EXPECT_FALSE(routed(p, Collective::all_reduce, 2, Route::schedule));
    EXPECT_TRUE(routed(p, Collective::broadcast, 3));
    EXPECT_TRUE(routed(p, Collective::reduce_scatter, 4, Route::direct));
  }
}

}  // namespace
