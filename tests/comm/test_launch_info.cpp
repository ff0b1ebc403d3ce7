// Node layouts from host keys (what the NCCL backend all-gathers at setup), and launch detection
// from each launcher's variables, as the launchers set them (the forms seen
// under mpirun, srun on 2 network-namespace nodes, sbatch, torchrun): ranks, node sizes in
// Slurm's compressed "2(x2)" / "3,1" lists, node indices, and a clear error for each
// inconsistent variable. The real launchers run the same code in the slurm_* and netns tests.
#include <gpucloud/comm/communicator.hpp>
#include <gpucloud/runtime/error.hpp>

#include "comm/node_layout.hpp"

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

extern char** environ;

namespace gc = gpucloud;

namespace {

// Clears every launcher variable, then sets @p vars, for one test.
class LaunchEnv : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<std::string> names;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string kv = *e;
      const std::string name = kv.substr(0, kv.find('='));
      for (const char* prefix : {"OMPI_COMM_WORLD_", "SLURM_", "PMI_", "MPI_LOCAL", "GPUCLOUD_LOCAL_SIZE"})
        if (name.rfind(prefix, 0) == 0) names.push_back(name);
      for (const char* exact :
           {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE"})
        if (name == exact) names.push_back(name);
    }
    for (const auto& n : names) ::unsetenv(n.c_str());
  }
  static void set(const std::map<std::string, std::string>& vars) {
    for (const auto& [k, v] : vars) ::setenv(k.c_str(), v.c_str(), 1);
  }
  static void expect(const gc::LaunchInfo& l, int rank, int size, int local_rank, int local_size, int node, int nodes,
                     const std::string& launcher) {
    EXPECT_EQ(l.rank, rank);
    EXPECT_EQ(l.size, size);
    EXPECT_EQ(l.local_rank, local_rank);
    EXPECT_EQ(l.local_size, local_size);
    EXPECT_EQ(l.node, node);
    EXPECT_EQ(l.nodes, nodes);
    EXPECT_EQ(l.launcher, launcher);
  }
  static std::string error_of() {
    try {
      (void)gc::launch_info_from_environment();
    } catch (const gc::InvalidArgument& e) {
      return e.what();
    }
    return "no error";
  }
};

// The step variables srun gives task @p rank of a step spread as @p per_node over the nodes.
std::map<std::string, std::string> srun_task(int rank, int size, int local_rank, int node, int nodes,
                                             const std::string& per_node) {
  return {{"SLURM_JOB_ID", "7"},
          {"SLURM_STEP_ID", "0"},
          {"SLURM_STEPID", "0"},
          {"SLURM_PROCID", std::to_string(rank)},
          {"SLURM_NTASKS", std::to_string(size)},
          {"SLURM_STEP_NUM_TASKS", std::to_string(size)},
          {"SLURM_LOCALID", std::to_string(local_rank)},
          {"SLURM_NODEID", std::to_string(node)},
          {"SLURM_NNODES", std::to_string(nodes)},
          {"SLURM_STEP_NUM_NODES", std::to_string(nodes)},
          {"SLURM_TASKS_PER_NODE", per_node},
          {"SLURM_STEP_TASKS_PER_NODE", per_node}};
}

TEST_F(LaunchEnv, AloneIsRankZeroOfOne) { expect(gc::launch_info_from_environment(), 0, 1, 0, 1, 0, 1, "none"); }

TEST_F(LaunchEnv, Mpirun) {
  set({{"OMPI_COMM_WORLD_RANK", "5"},
       {"OMPI_COMM_WORLD_SIZE", "8"},
       {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
       {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}});
  expect(gc::launch_info_from_environment(), 5, 8, 1, 4, -1, 0, "mpirun");  // OpenMPI does not name the node
  ::setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "8", 1);
  ::setenv("OMPI_COMM_WORLD_LOCAL_RANK", "5", 1);
  expect(gc::launch_info_from_environment(), 5, 8, 5, 8, 0, 1, "mpirun");  // all on one node
}

TEST_F(LaunchEnv, MpirunInsideASlurmAllocationIsMpirun) {
  set({{"SLURM_JOB_ID", "7"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_TASKS_PER_NODE", "2(x2)"}});
  set({{"OMPI_COMM_WORLD_RANK", "3"},
       {"OMPI_COMM_WORLD_SIZE", "4"},
       {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
       {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  expect(gc::launch_info_from_environment(), 3, 4, 1, 2, -1, 0, "mpirun");
}

TEST_F(LaunchEnv, SrunTwoNodesOfTwo) {
  // srun -N 2 --ntasks-per-node 2: SLURM_STEP_TASKS_PER_NODE=2(x2)
  set(srun_task(3, 4, 1, 1, 2, "2(x2)"));
  expect(gc::launch_info_from_environment(), 3, 4, 1, 2, 1, 2, "srun");
}

TEST_F(LaunchEnv, SrunUnevenNodes) {
  // srun -N 2 -n 4 on nodes of 4 CPUs: 3 tasks on the first node, 1 on the second.
  set(srun_task(1, 4, 1, 0, 2, "3,1"));
  expect(gc::launch_info_from_environment(), 1, 4, 1, 3, 0, 2, "srun");
  set(srun_task(3, 4, 0, 1, 2, "3,1"));
  expect(gc::launch_info_from_environment(), 3, 4, 0, 1, 1, 2, "srun");
  set(srun_task(6, 7, 0, 3, 4, "2(x3),1"));
  expect(gc::launch_info_from_environment(), 6, 7, 0, 1, 3, 4, "srun");
}

TEST_F(LaunchEnv, SrunStepVariablesWinOverTheJobs) {
  // A one-task step on the second node of a 4-task job: the step's variables describe the task.
  set(srun_task(0, 1, 0, 0, 1, "1"));
  set({{"SLURM_NTASKS", "4"}, {"SLURM_TASKS_PER_NODE", "3,1"}, {"SLURM_NNODES", "2"}});
  expect(gc::launch_info_from_environment(), 0, 1, 0, 1, 0, 1, "srun");
}

TEST_F(LaunchEnv, SrunWithoutTasksPerNodeIsOneNode) {
  set({{"SLURM_STEP_ID", "0"}, {"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "1"}});
  expect(gc::launch_info_from_environment(), 1, 2, 1, 2, 0, 1, "srun");
}

TEST_F(LaunchEnv, SlurmBatchScriptIsOneProcess) {
  // sbatch -N 2 -n 4: the batch script sees the allocation's SLURM_NTASKS=4 and SLURM_PROCID=0
  // but no step; it is one process (the tasks are what srun starts).
  set({{"SLURM_JOB_ID", "7"},
       {"SLURM_PROCID", "0"},
       {"SLURM_LOCALID", "0"},
       {"SLURM_NODEID", "0"},
       {"SLURM_NTASKS", "4"},
       {"SLURM_NNODES", "2"},
       {"SLURM_TASKS_PER_NODE", "3,1"}});
  expect(gc::launch_info_from_environment(), 0, 1, 0, 1, 0, 1, "slurm-batch");
}

TEST_F(LaunchEnv, Torchrun) {
  set({{"RANK", "6"},
       {"WORLD_SIZE", "8"},
       {"LOCAL_RANK", "2"},
       {"LOCAL_WORLD_SIZE", "4"},
       {"GROUP_RANK", "1"},
       {"GROUP_WORLD_SIZE", "2"}});
  expect(gc::launch_info_from_environment(), 6, 8, 2, 4, 1, 2, "torchrun");
  ::unsetenv("GROUP_WORLD_SIZE");
  expect(gc::launch_info_from_environment(), 6, 8, 2, 4, -1, 0, "torchrun");
}

TEST_F(LaunchEnv, MpichHydra) {
  set({{"PMI_RANK", "3"}, {"PMI_SIZE", "4"}, {"MPI_LOCALRANKID", "1"}, {"MPI_LOCALNRANKS", "2"}});
  expect(gc::launch_info_from_environment(), 3, 4, 1, 2, -1, 0, "mpirun");
}

TEST_F(LaunchEnv, SimulatedNodesOverrideTheLauncher) {
  set(srun_task(5, 8, 1, 1, 2, "4(x2)"));
  ::setenv("GPUCLOUD_LOCAL_SIZE", "2", 1);
  expect(gc::launch_info_from_environment(), 5, 8, 1, 2, 2, 4, "srun");
  ::setenv("GPUCLOUD_LOCAL_SIZE", "3", 1);
  EXPECT_NE(error_of().find("GPUCLOUD_LOCAL_SIZE: '3' does not divide the job's 8 processes"), std::string::npos)
      << error_of();
}

TEST_F(LaunchEnv, BadVariablesNameThemselves) {
  set(srun_task(3, 4, 1, 1, 2, "2(x"));
  EXPECT_NE(error_of().find("SLURM_STEP_TASKS_PER_NODE: '2(x' is not a list of task counts"), std::string::npos)
      << error_of();
  set(srun_task(3, 4, 1, 1, 2, "2,,2"));
  EXPECT_NE(error_of().find("SLURM_STEP_TASKS_PER_NODE"), std::string::npos) << error_of();
  set(srun_task(3, 4, 1, 1, 2, "0(x2)"));
  EXPECT_NE(error_of().find("count out of range"), std::string::npos) << error_of();
  set(srun_task(3, 4, 1, 1, 2, "3(x2)"));
  EXPECT_NE(error_of().find("counts 6 tasks but the step has 4"), std::string::npos) << error_of();
  set(srun_task(3, 4, 1, 2, 2, "2(x2)"));
  EXPECT_NE(error_of().find("SLURM_NODEID: 2 is not one of the step's 2 nodes"), std::string::npos) << error_of();
  set(srun_task(3, 4, 2, 1, 2, "2(x2)"));
  EXPECT_NE(error_of().find("local rank 2 is outside a node of 2"), std::string::npos) << error_of();
  set(srun_task(4, 4, 1, 1, 2, "2(x2)"));
  EXPECT_NE(error_of().find("rank 4 is outside a job of 4"), std::string::npos) << error_of();
  set(srun_task(3, 4, 1, 1, 2, "2(x2)"));
  ::setenv("SLURM_PROCID", "three", 1);
  EXPECT_NE(error_of().find("SLURM_PROCID: 'three' is not an integer"), std::string::npos) << error_of();
}

// Node layouts from every rank's host key: blocks, round-robin and uneven nodes as they are.
void expect_layout(const std::vector<std::uint64_t>& keys, int rank, gc::detail::NodeLayout want) {
  const gc::detail::NodeLayout l = gc::detail::node_layout(keys, rank);
  EXPECT_EQ(l.local_rank, want.local_rank) << "rank " << rank;
  EXPECT_EQ(l.local_size, want.local_size) << "rank " << rank;
  EXPECT_EQ(l.node, want.node) << "rank " << rank;
  EXPECT_EQ(l.nodes, want.nodes) << "rank " << rank;
  EXPECT_EQ(l.uniform, want.uniform) << "rank " << rank;
}

TEST(NodeLayout, BlocksRoundRobinAndUnevenNodes) {
  const std::uint64_t a = 11, b = 7;  // nodes are numbered by first rank, not by key
  expect_layout({a, a, b, b}, 2, {0, 2, 1, 2, true});
  expect_layout({a, a, b, b}, 1, {1, 2, 0, 2, true});
  expect_layout({a, b, a, b}, 2, {1, 2, 0, 2, true});  // srun --distribution=cyclic
  expect_layout({a, b, a, b}, 3, {1, 2, 1, 2, true});
  expect_layout({a, a, a, b}, 3, {0, 1, 1, 2, false});  // 3 ranks on one node, 1 on the other
  expect_layout({a, a, a, b}, 2, {2, 3, 0, 2, false});
  expect_layout({b}, 0, {0, 1, 0, 1, true});
  expect_layout({a, a, a, a}, 3, {3, 4, 0, 1, true});
}

TEST(NodeLayout, SimulatedBlocksAndThisHostsKey) {
  const gc::detail::NodeLayout l = gc::detail::block_layout(5, 8, 2);
  EXPECT_EQ(l.local_rank, 1);
  EXPECT_EQ(l.local_size, 2);
  EXPECT_EQ(l.node, 2);
  EXPECT_EQ(l.nodes, 4);
  EXPECT_TRUE(l.uniform);
  EXPECT_EQ(gc::detail::host_key(), gc::detail::host_key());
  EXPECT_NE(gc::detail::host_key(), 14695981039346656037ull);  // not the empty name's hash
}

}  // namespace
