// Gradient buckets and the cost model across MPI ranks: bucketed averages equal one big
// all-reduce in any ready order, a bucketer dropped after wait(), duplicate gradients, and the
// alpha-beta model measured on the job.
#include <gpucloud/comm/communicator.hpp>
#include <gpucloud/comm/grad_buckets.hpp>
#include <gpucloud/comm/mpi_interop.hpp>
#include <gpucloud/memory/buffer.hpp>
#include <gpucloud/movement/copy.hpp>
#include <gpucloud/runtime/build_info.hpp>
#include <gpucloud/runtime/error.hpp>
#include <gpucloud/runtime/stream.hpp>

#include <gtest/gtest.h>
#include <mpi.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <future>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "collectives_cases.hpp"

namespace gc = gpucloud;
using namespace gc::testing::collectives;  // NOLINT(google-build-using-namespace): the suite's harness

TEST(GradBuckets, DeliverTheSameAverageAsOneBigAllReduceInAnyReadyOrder) {
  auto& c = world();
  gc::Stream compute;
  // Mixed sizes, a dtype change, one gradient bigger than the cap.
  const std::vector<std::pair<std::size_t, gc::DType>> shapes = {
      {300, gc::DType::float32}, {5000, gc::DType::float32}, {17, gc::DType::float32}, {70000, gc::DType::float32},
      {64, gc::DType::float16},  {1000, gc::DType::float16}, {3, gc::DType::float32},  {2500, gc::DType::float32}};
  for (bool hierarchical : {false, true}) {
    for (bool compress : {false, true}) {
      std::vector<gc::Buffer> grads;
      std::vector<gc::BufferView> views;
      for (std::size_t g = 0; g < shapes.size(); ++g) {
        grads.push_back(inputs(shapes[g].second, shapes[g].first, c.rank() + static_cast<int>(g)));
        views.push_back(grads.back());
      }
      gc::BucketOptions o;
      o.first_bucket_bytes = 2048;
      o.bucket_bytes = 32 << 10;
      o.hierarchical = hierarchical;
      if (compress) o.wire_dtype = gc::DType::bfloat16;
      gc::GradBucketer bucketer(c, views, o);
      EXPECT_GE(bucketer.bucket_count(), 4u);
      // Each rank marks its gradients ready in its own order.
      std::vector<std::size_t> order(shapes.size());
      for (std::size_t i = 0; i < order.size(); ++i)
        order[i] = (i * (3 + 2 * static_cast<std::size_t>(c.rank())) + 1) % order.size();
      std::vector<bool> seen(order.size());
      std::size_t next = 0;
      for (std::size_t k = 0; k < order.size(); ++k) {  // make it a permutation
        while (seen[order[k]]) order[k] = (order[k] + 1) % order.size();
        seen[order[k]] = true;
        ++next;
      }
      for (std::size_t i : order) {
        const std::size_t before = bucketer.launched();
        bucketer.mark_ready(i, compute);
        // A bucket is launched the moment it and all earlier buckets are ready.
        EXPECT_GE(bucketer.launched(), before);
      }
      EXPECT_EQ(bucketer.launched(), bucketer.bucket_count());
      bucketer.wait(compute);
      compute.synchronize();
      std::size_t wrong = 0;
      for (std::size_t g = 0; g < shapes.size(); ++g) {
        for (std::size_t i = 0; i < shapes[g].first; ++i) {
          double want = 0;
          for (int r = 0; r < c.size(); ++r) want += value(r + static_cast<int>(g), i);
          want /= c.size();
          const bool narrow = compress || shapes[g].second != gc::DType::float32;
          wrong += std::abs(load(grads[g], i) - want) > (narrow ? 1e-2 * std::abs(want) : 1e-6 * std::abs(want));
        }
      }
      EXPECT_EQ(wrong, 0u) << "hierarchical " << hierarchical << " compress " << compress;
      EXPECT_THROW(bucketer.wait(compute), gc::InvalidArgument);  // nothing marked in the new step
      bucketer.mark_ready(0, compute);
      EXPECT_THROW(bucketer.mark_ready(0, compute), gc::InvalidArgument);
      EXPECT_THROW(bucketer.mark_ready(99, compute), gc::InvalidArgument);
      for (std::size_t i = 1; i < shapes.size(); ++i) bucketer.mark_ready(i, compute);  // finish the step
      bucketer.wait(compute);
      compute.synchronize();
    }
  }
}

TEST(CostModel, MeasuredOnThisJobAndUsedByAllReduceAuto) {
  auto& c = world();
  gc::Stream s;
  const gc::AllReduceCostModel m = c.measure_cost_model(s);
  EXPECT_EQ(m.local_size, c.hierarchy().group_size);  // the hierarchy's groups: the nodes by default
  EXPECT_EQ(m.nodes, c.hierarchy().groups);
  // The MPI backend halves and doubles its flat all-reduce on 4, 8 or 16 ranks over several nodes.
  EXPECT_EQ(m.flat_halving, (c.size() == 4 || c.size() == 8 || c.size() == 16) && c.nodes() > 1);
  if (c.local_size() > 1) {
    EXPECT_GT(m.intra.alpha, 0.0);
    EXPECT_GE(m.intra.beta, 0.0);
  }
  if (c.rank() == 0) {
    std::printf("measured cost model: %s\n", m.to_json().c_str());
    for (std::size_t bytes : {std::size_t{8}, std::size_t{1} << 20, std::size_t{16} << 20}) {
      std::printf("  %9zu B: predicted flat %.1f us, hierarchical %.1f us\n", bytes, m.flat_seconds(bytes) * 1e6,
                  m.hierarchical_seconds(bytes) * 1e6);
    }
  }
  // Whatever it chooses, the result is the all-reduce's.
  gc::Buffer data = inputs(gc::DType::int64, 5001, c.rank());
  c.all_reduce_auto(data, data, gc::ReduceOp::sum, s);
  s.synchronize();
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < 5001; ++i) wrong += load(data, i) != expected(gc::ReduceOp::sum, c.size(), i);
  EXPECT_EQ(wrong, 0u);
  gc::AllReduceCostModel other = m;
  other.nodes += 1;
  EXPECT_THROW(c.set_cost_model(other), gc::InvalidArgument);
}

// Where the model's predictions tie (a model with no latency and one link speed ties at every
// size), all_reduce_auto times both forms on the first six calls of a size class and then every
// rank takes the same one: a rank that took the other form would meet mismatched collectives.
// Every call's sum is exact; a new model starts the trials again.
TEST(CostModel, AllReduceAutoTimesBothFormsWhereTheModelTiesAndEveryRankKeepsOne) {
  auto& c = world();
  gc::Stream s;
  gc::AllReduceCostModel tie = c.measure_cost_model(s);
  tie.intra = tie.inter = {0.0, 1e-9};
  c.set_cost_model(tie);
  const bool chooses = c.hierarchy().groups > 1 && c.hierarchy().group_size > 1;
  const std::size_t n = 70001;  // int64: 560 KB, class 2^19
  const std::size_t bytes = n * 8;
  ASSERT_TRUE(tie.ties(bytes));
  const gc::AllReduceForm before = c.all_reduce_auto_form(bytes);
  EXPECT_EQ(before, chooses ? gc::AllReduceForm::measuring : gc::AllReduceForm::flat);
  for (int call = 0; call < 9; ++call) {
    gc::Buffer data = inputs(gc::DType::int64, n, c.rank() + call);
    c.all_reduce_auto(data, data, gc::ReduceOp::sum, s);
    s.synchronize();
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < n; ++i) {
      double want = 0;
      for (int r = 0; r < c.size(); ++r) want += value(r + call, i);
      wrong += load(data, i) != want;
    }
    EXPECT_EQ(wrong, 0u) << "call " << call;
    if (chooses) {
      EXPECT_EQ(c.all_reduce_auto_form(bytes) == gc::AllReduceForm::measuring, call < 5) << "call " << call;
    }
  }
  const gc::AllReduceForm form = c.all_reduce_auto_form(bytes);
  // Every rank holds the same form (gathered), and a size class of its own is still measuring.
  gc::Buffer mine(1, gc::DType::int64), all(static_cast<std::size_t>(c.size()), gc::DType::int64);
  *static_cast<std::int64_t*>(mine.data()) = static_cast<std::int64_t>(form);
  c.all_gather(mine, all, s);
  s.synchronize();
  for (int r = 0; r < c.size(); ++r) EXPECT_EQ(load(all, static_cast<std::size_t>(r)), static_cast<double>(form)) << r;
  if (chooses) {
    EXPECT_EQ(c.all_reduce_auto_form(bytes * 4), gc::AllReduceForm::measuring);
    c.set_cost_model(tie);  // a model set again measures again
    EXPECT_EQ(c.all_reduce_auto_form(bytes), gc::AllReduceForm::measuring);
  }
  // A model that does not tie takes its prediction at once (a ring sends the whole message across
  // the slow network; halving and doubling on 2 x 2 would send what the hierarchical form sends).
  gc::AllReduceCostModel apart = tie;
  apart.inter = {1e-3, 1e-7};
  apart.flat_halving = false;
  c.set_cost_model(apart);
  if (chooses) {
    ASSERT_FALSE(apart.ties(bytes));
    EXPECT_EQ(c.all_reduce_auto_form(bytes),
              apart.prefer_hierarchical(bytes) ? gc::AllReduceForm::hierarchical : gc::AllReduceForm::flat);
  }
  c.measure_cost_model(s);
}

// A bucketer dropped right after wait() while the caller's stream is still busy: the error check
// wait() enqueued holds the communication stream, so it runs on live memory.
TEST(GradBuckets, ABucketerDroppedRightAfterWaitLeavesTheQueuedCheckValid) {
  auto& c = world();
  gc::Stream compute;
  gc::Buffer g = inputs(gc::DType::float32, 1000, c.rank());
  std::promise<void> gate;
  std::shared_future<void> open = gate.get_future().share();
  {
    gc::GradBucketer bucketer(c, {g});
    bucketer.mark_ready(0, compute);
    gc::launch_host_func(compute, [open] { open.wait(); });
    bucketer.wait(compute);
  }  // dropped with the check queued behind the gate
  gate.set_value();
  compute.synchronize();
  for (std::size_t i = 0; i < 1000; ++i) ASSERT_EQ(load(g, i), expected(gc::ReduceOp::average, c.size(), i));
}

TEST(GradBuckets, ADuplicateGradientIsRejected) {
  gc::Buffer g(10, gc::DType::float32);
  gc::Buffer h(10, gc::DType::float32);
  EXPECT_THROW(gc::GradBucketer(world(), {g, h, g}), gc::InvalidArgument);
}
