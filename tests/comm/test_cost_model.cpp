// The alpha-beta model's formulas and its saved form.
#include <gpucloud/comm/cost_model.hpp>
#include <gpucloud/runtime/error.hpp>

#include <gtest/gtest.h>

#include "comm/auto_form.hpp"
#include "comm/cost_model_fit.hpp"

#include <vector>

namespace gc = gpucloud;

TEST(CostModel, RingFormulas) {
  gc::AllReduceCostModel m;
  m.intra = {5e-6, 1.0 / 200e9};
  m.inter = {10e-6, 1.0 / 25e9};
  m.local_size = 8;
  m.nodes = 4;
  const double s = 1 << 30;
  // flat: 2(n-1) alpha_e + 2(n-1)/n S beta_e with n = 32
  EXPECT_DOUBLE_EQ(m.flat_seconds(1 << 30), 62 * 10e-6 + 62.0 / 32 * s / 25e9);
  // hierarchical: 2 [(L-1) alpha_i + (L-1) S/L beta_i] + 2(N-1) alpha_e + 2(N-1)/N (S/L) beta_e
  EXPECT_DOUBLE_EQ(m.hierarchical_seconds(1 << 30),
                   2 * (7 * 5e-6 + 7 * (s / 8) / 200e9) + 6 * 10e-6 + 6.0 / 4 * (s / 8) / 25e9);
  EXPECT_TRUE(m.prefer_hierarchical(1 << 30));  // a slow network: only 1/8 of the data crosses it
  gc::AllReduceCostModel one_node = m;
  one_node.nodes = 1;
  EXPECT_EQ(one_node.hierarchical_seconds(1 << 20), 2 * (7 * 5e-6 + 7 * (double(1 << 20) / 8) / 200e9));
  EXPECT_EQ(gc::AllReduceCostModel{}.flat_seconds(1 << 20), 0.0);  // one rank: nothing to do
  // halving and doubling, low bits first: 2 [log2 L alpha_i + (L-1)/L S beta_i] + 2 [log2 N alpha_e + (N-1)/N S/L
  // beta_e]; as much crosses the network as in the hierarchical form, in fewer steps
  gc::AllReduceCostModel halves = m;
  halves.flat_halving = true;
  EXPECT_DOUBLE_EQ(halves.flat_seconds(1 << 30),
                   2 * (3 * 5e-6 + 7.0 / 8 * s / 200e9) + 2 * (2 * 10e-6 + 3.0 / 4 * (s / 8) / 25e9));
  EXPECT_FALSE(halves.prefer_hierarchical(1 << 30));
  EXPECT_FALSE(halves.prefer_hierarchical(8));
  one_node.flat_halving = true;  // on one node the backend does not halve: the ring stands
  EXPECT_EQ(one_node.flat_seconds(1 << 20), m.intra.alpha * 14 + 14.0 / 8 * double(1 << 20) * m.intra.beta);
}

TEST(CostModel, JsonRoundTrip) {
  gc::AllReduceCostModel m;
  m.intra = {1.25e-6, 3.5e-12};
  m.inter = {7e-6, 4.25e-11};
  m.local_size = 4;
  m.nodes = 16;
  const auto back = gc::AllReduceCostModel::from_json(m.to_json());
  EXPECT_EQ(back.intra.alpha, m.intra.alpha);
  EXPECT_EQ(back.inter.beta, m.inter.beta);
  EXPECT_EQ(back.nodes, 16);
  EXPECT_FALSE(back.flat_halving);
  m.flat_halving = true;
  EXPECT_TRUE(gc::AllReduceCostModel::from_json(m.to_json()).flat_halving);
  // A model saved before flat_halving existed loads as a ring.
  EXPECT_FALSE(gc::AllReduceCostModel::from_json("{\"intra_alpha\": 1e-6, \"intra_beta\": 1e-11, \"inter_alpha\": "
                                                 "1e-5, \"inter_beta\": 1e-10, \"local_size\": 2, \"nodes\": 2}")
                   .flat_halving);
  EXPECT_THROW(gc::AllReduceCostModel::from_json("{\"intra_alpha\": 1}"), gc::InvalidArgument);
}

// measure_cost_model() fits each link three times, interleaved: each parameter is the median of
// its fits, so one fit that met a busy moment moves nothing, and a node's own link is never taken
// as slower than the network's.
TEST(CostModel, RepeatedFitsTakeMediansAndKeepTheNodeFasterThanTheNetwork) {
  gc::AllReduceCostModel m;
  m.local_size = 3;
  m.nodes = 2;
  const std::vector<gc::LinkCost> intra = {{2e-6, 1e-10}, {90e-6, 50e-9}, {3e-6, 2e-10}};  // the 2nd: busy
  const std::vector<gc::LinkCost> inter = {{60e-6, 8e-9}, {50e-6, 9e-9}, {70e-6, 1e-9}};
  gc::detail::set_links(m, intra, inter);
  EXPECT_DOUBLE_EQ(m.intra.alpha, 3e-6);
  EXPECT_DOUBLE_EQ(m.intra.beta, 2e-10);
  EXPECT_DOUBLE_EQ(m.inter.alpha, 60e-6);
  EXPECT_DOUBLE_EQ(m.inter.beta, 8e-9);
  // Two of three intra fits busy: shared memory measured slower than the network is capped at it.
  gc::detail::set_links(m, {{90e-6, 50e-9}, {80e-6, 40e-9}, {2e-6, 1e-10}}, inter);
  EXPECT_DOUBLE_EQ(m.intra.alpha, 60e-6);
  EXPECT_DOUBLE_EQ(m.intra.beta, 8e-9);
  // One node: inter is intra.
  gc::AllReduceCostModel one;
  gc::detail::set_links(one, intra, {});
  EXPECT_DOUBLE_EQ(one.inter.beta, one.intra.beta);
  EXPECT_DOUBLE_EQ(one.intra.alpha, 3e-6);
}

// Predictions within 10 % of each other tie: all_reduce_auto() then times both forms. With no
// latency and one link speed the two forms move the same bytes (a tie at every size); a network
// ten times slower than the node makes the hierarchical form clearly faster.
TEST(CostModel, PredictionsWithinATenthTie) {
  gc::AllReduceCostModel m;
  m.local_size = 2;
  m.nodes = 2;
  m.intra = m.inter = {0.0, 1e-9};
  for (std::size_t bytes : {std::size_t{4096}, std::size_t{2} << 20, std::size_t{64} << 20}) {
    EXPECT_TRUE(m.ties(bytes)) << bytes;
  }
  m.local_size = 4;
  m.inter = {20e-6, 1e-8};
  EXPECT_TRUE(m.prefer_hierarchical(std::size_t{16} << 20));
  EXPECT_FALSE(m.ties(std::size_t{16} << 20));
  // Latency alone: the ring over 4 ranks takes 6 alpha, the hierarchical form 2 + 2.
  m.intra = m.inter = {1e-6, 0.0};
  m.local_size = 2;
  m.flat_halving = false;
  EXPECT_FALSE(m.ties(8));
  EXPECT_TRUE(m.prefer_hierarchical(8));
}

// The trials of one size class: flat first, alternating, three calls each; the slowest rank's
// medians decide (one slow call, a first touch or a busy moment, does not), flat when equal.
TEST(CostModel, AutoFormTrialsAlternateThenTheLowerMedianDecides) {
  using gc::AllReduceForm;
  gc::detail::AutoFormTrials t;
  EXPECT_EQ(t.form(), AllReduceForm::measuring);
  const double times[] = {5.0, 9.0, 5.1, 3.0, 4.9, 3.1};  // flat, hier, flat, ...: hier's median 3.1
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(t.next(), i % 2 == 0 ? AllReduceForm::flat : AllReduceForm::hierarchical) << i;
    EXPECT_EQ(t.record(times[i]), i == 5) << i;
  }
  EXPECT_EQ(t.seconds()[1], 9.0);
  EXPECT_EQ(t.form(), AllReduceForm::measuring);  // until every rank's times are combined
  EXPECT_TRUE(t.record(1.0));                     // a retry after a failed combination adds nothing
  EXPECT_EQ(t.seconds()[0], 5.0);
  gc::detail::AutoFormTrials::Seconds slowest = {5.0, 9.0, 5.1, 3.0, 4.9, 3.1};
  t.decide(slowest);
  EXPECT_EQ(t.form(), AllReduceForm::hierarchical);
  EXPECT_EQ(t.next(), AllReduceForm::hierarchical);
  EXPECT_EQ(gc::detail::AutoFormTrials::faster({1.0, 1.0, 1.0, 1.0, 1.0, 1.0}), AllReduceForm::flat);
  EXPECT_EQ(gc::detail::AutoFormTrials::faster({1.0, 0.5, 1.0, 9.0, 1.0, 9.0}), AllReduceForm::flat);
  EXPECT_EQ(gc::detail::auto_size_class(0), 0);
  EXPECT_EQ(gc::detail::auto_size_class(1), 0);
  EXPECT_EQ(gc::detail::auto_size_class(2u << 20), 21);
  EXPECT_EQ(gc::detail::auto_size_class((4u << 20) - 1), 21);
}
