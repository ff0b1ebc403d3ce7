// Communicator::from_transport in one process: ranks are threads and the transport a shared
// exchange between them (what a framework's process group is to the library). Every collective
// against exact answers on 4 ranks, as one node and as 2 simulated nodes (the hierarchical
// all-reduce on split transports), a mismatched collective as an error on every rank with the
// communicator still usable, a transport that fails as a CommunicationError naming the
// operation, and bad arguments. Runs in every configuration, ThreadSanitizer's too.
#include <gpucloud/comm/communicator.hpp>
#include <gpucloud/comm/transport.hpp>
#include <gpucloud/memory/buffer.hpp>
#include <gpucloud/runtime/error.hpp>
#include <gpucloud/runtime/stream.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

namespace gc = gpucloud;

namespace {

// The ranks' meeting point: each collective is a round in which every rank deposits its bytes,
// the last to arrive lets all read everyone's, and the round ends when all have read.
class Exchange {
 public:
  explicit Exchange(int size) : size_(size), slots_(static_cast<std::size_t>(size)) {}
  int size() const { return size_; }

  // Deposits @p mine for @p rank, waits for every rank's, calls @p read(all), waits for all readers.
  void round(int rank, std::vector<unsigned char> mine,
             const std::function<void(const std::vector<std::vector<unsigned char>>&)>& read) {
    std::unique_lock<std::mutex> lock(mutex_);
    cv_.wait(lock, [&] { return !reading_; });  // the previous round's readers are done
    slots_[static_cast<std::size_t>(rank)] = std::move(mine);
    const std::uint64_t round = round_;
    if (++arrived_ == size_) {
      reading_ = true;
      cv_.notify_all();
    } else {
      cv_.wait(lock, [&] { return reading_ && round_ == round; });
    }
    read(slots_);
    if (++read_ == size_) {
      arrived_ = read_ = 0;
      reading_ = false;
      ++round_;
      cv_.notify_all();
    }
  }

  // The group of ranks @p members (shared by them), made once per split round and color.
  std::shared_ptr<Exchange> group(std::uint64_t split, int color, int size) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& g = groups_[{split, color}];
    if (!g) g = std::make_shared<Exchange>(size);
    return g;
  }
  std::uint64_t next_split() {
    std::lock_guard<std::mutex> lock(mutex_);
    return splits_;
  }
  void split_done() {
    std::lock_guard<std::mutex> lock(mutex_);
    ++splits_;
  }

 private:
  const int size_;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<std::vector<unsigned char>> slots_;
  int arrived_ = 0, read_ = 0;
  bool reading_ = false;
  std::uint64_t round_ = 0, splits_ = 0;
  std::map<std::tuple<std::uint64_t, int>, std::shared_ptr<Exchange>> groups_;
};

template <class T>
void combine(void* into, const void* from, std::size_t n, gc::ReduceOp op) {
  auto* a = static_cast<T*>(into);
  const auto* b = static_cast<const T*>(from);
  for (std::size_t i = 0; i < n; ++i)
    a[i] = op == gc::ReduceOp::max   ? std::max(a[i], b[i])
           : op == gc::ReduceOp::min ? std::min(a[i], b[i])
                                     : a[i] + b[i];
}

class ThreadTransport final : public gc::HostTransport {
 public:
  ThreadTransport(std::shared_ptr<Exchange> exchange, int rank) : ex_(std::move(exchange)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return ex_->size(); }
  void all_reduce(gc::BufferView data, gc::ReduceOp op) override {
    if (fail_) throw std::runtime_error("connection reset by peer (test)");
    const std::size_t bytes = data.size_bytes();
    std::vector<unsigned char> mine(bytes);
    std::memcpy(mine.data(), data.data(), bytes);
    ex_->round(rank_, std::move(mine), [&](const auto& all) {
      std::memcpy(data.data(), all[0].data(), bytes);
      for (std::size_t r = 1; r < all.size(); ++r) {
        switch (data.dtype()) {
          case gc::DType::float32:
            combine<float>(data.data(), all[r].data(), data.size(), op);
            break;
          case gc::DType::float64:
            combine<double>(data.data(), all[r].data(), data.size(), op);
            break;
          case gc::DType::int64:
            combine<std::int64_t>(data.data(), all[r].data(), data.size(), op);
            break;
          case gc::DType::int32:
            combine<std::int32_t>(data.data(), all[r].data(), data.size(), op);
            break;
          default:
            throw std::runtime_error("test transport: dtype not reducible here");
        }
      }
    });
  }
  void all_gather(gc::BufferView send, gc::BufferView recv) override {
    std::vector<unsigned char> mine(send.size_bytes());
    std::memcpy(mine.data(), send.data(), mine.size());
    ex_->round(rank_, std::move(mine), [&](const auto& all) {
      for (std::size_t r = 0; r < all.size(); ++r)
        std::memcpy(static_cast<unsigned char*>(recv.data()) + r * send.size_bytes(), all[r].data(), send.size_bytes());
    });
  }
  void broadcast(gc::BufferView data, int root) override {
    std::vector<unsigned char> mine(data.size_bytes());
    std::memcpy(mine.data(), data.data(), mine.size());
    ex_->round(rank_, std::move(mine), [&](const auto& all) {
      std::memcpy(data.data(), all[static_cast<std::size_t>(root)].data(), data.size_bytes());
    });
  }
  std::shared_ptr<gc::HostTransport> split(int color, int key) override {
    const std::uint64_t id = ex_->next_split();
    std::vector<std::tuple<int, int, int>> members;  // (color, key, rank)
    std::vector<unsigned char> mine(3 * sizeof(int));
    const int fields[3] = {color, key, rank_};
    std::memcpy(mine.data(), fields, sizeof fields);
    ex_->round(rank_, std::move(mine), [&](const auto& all) {
      for (const auto& a : all) {
        int f[3];
        std::memcpy(f, a.data(), sizeof f);
        members.emplace_back(f[0], f[1], f[2]);
      }
    });
    std::vector<std::pair<int, int>> same;  // (key, rank) of my color
    for (const auto& [c, k, r] : members)
      if (c == color) same.emplace_back(k, r);
    std::sort(same.begin(), same.end());
    const int my_rank =
        static_cast<int>(std::find(same.begin(), same.end(), std::make_pair(key, rank_)) - same.begin());
    auto part = std::make_shared<ThreadTransport>(ex_->group(id, color, static_cast<int>(same.size())), my_rank);
    // Everyone has its group before the next split can start.
    ex_->round(rank_, {}, [](const auto&) {});
    if (rank_ == 0) ex_->split_done();
    ex_->round(rank_, {}, [](const auto&) {});
    return part;
  }
  bool fail_ = false;

 private:
  std::shared_ptr<Exchange> ex_;
  int rank_;
};

// Runs @p body(rank, transport) on @p n threads; the first failure is rethrown.
void on_ranks(int n, const std::function<void(int, std::shared_ptr<ThreadTransport>)>& body) {
  auto ex = std::make_shared<Exchange>(n);
  std::vector<std::thread> threads;
  std::mutex m;
  std::exception_ptr failure;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        body(r, std::make_shared<ThreadTransport>(ex, r));
      } catch (...) {
        std::lock_guard<std::mutex> lock(m);
        if (!failure) failure = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (failure) std::rethrow_exception(failure);
}

void every_collective(int rank, std::shared_ptr<ThreadTransport> t, int want_nodes, bool checks = true) {
  gc::Communicator c = gc::Communicator::from_transport(t);
  const int n = c.size();
  EXPECT_EQ(c.backend(), gc::CommBackend::transport);
  EXPECT_EQ(c.rank(), rank);
  EXPECT_EQ(c.nodes(), want_nodes);
  gc::Stream s;
  const std::size_t count = 1001;
  gc::Buffer x(count, gc::DType::float32), flat(count, gc::DType::float32), hier(count, gc::DType::float32);
  for (std::size_t i = 0; i < count; ++i) x.data_as<float>()[i] = static_cast<float>(i + rank);
  c.all_reduce(x, flat, gc::ReduceOp::sum, s);
  c.hierarchical_all_reduce(x, hier, gc::ReduceOp::sum, s);
  gc::Buffer avg(5, gc::DType::float64), ints(3, gc::DType::int64), gathered(2 * n, gc::DType::int32);
  for (int i = 0; i < 5; ++i) avg.data_as<double>()[i] = rank + 1;
  for (int i = 0; i < 3; ++i) ints.data_as<std::int64_t>()[i] = rank + 1;
  c.all_reduce(avg, avg, gc::ReduceOp::average, s);
  c.all_reduce(ints, ints, gc::ReduceOp::max, s);
  gc::Buffer mine(2, gc::DType::int32), shard(2, gc::DType::float32), whole(2 * n, gc::DType::float32),
      root(3, gc::DType::int64);
  mine.data_as<std::int32_t>()[0] = rank;
  mine.data_as<std::int32_t>()[1] = 10 * rank;
  c.all_gather(mine, gathered, s);
  for (int i = 0; i < 2 * n; ++i) whole.data_as<float>()[i] = static_cast<float>(i);
  c.reduce_scatter(whole, shard, gc::ReduceOp::sum, s);
  for (int i = 0; i < 3; ++i) root.data_as<std::int64_t>()[i] = rank;
  c.broadcast(root, n - 1, s);
  c.barrier(s);
  s.synchronize();
  for (std::size_t i = 0; i < count; ++i) {
    const auto want = static_cast<float>(i * static_cast<std::size_t>(n) + static_cast<std::size_t>(n * (n - 1) / 2));
    ASSERT_EQ(flat.data_as<float>()[i], want) << i;
    ASSERT_EQ(hier.data_as<float>()[i], want) << i;
  }
  EXPECT_EQ(avg.data_as<double>()[0], (n + 1) / 2.0);
  EXPECT_EQ(ints.data_as<std::int64_t>()[2], n);
  for (int r = 0; r < n; ++r) EXPECT_EQ(gathered.data_as<std::int32_t>()[2 * r + 1], 10 * r);
  EXPECT_EQ(shard.data_as<float>()[1], static_cast<float>((2 * rank + 1) * n));
  EXPECT_EQ(root.data_as<std::int64_t>()[0], n - 1);

  if (!checks) return;  // without the agreement a mismatch is the transport's to notice
  // A mismatched count: an error on every rank, nothing exchanged, the communicator still usable.
  gc::Buffer bad(4 + static_cast<std::size_t>(rank), gc::DType::float32);
  c.all_reduce(bad, bad, gc::ReduceOp::sum, s);
  try {
    s.synchronize();
    ADD_FAILURE() << "a mismatched all-reduce ran";
  } catch (const gc::CommunicationError& e) {
    EXPECT_NE(std::string(e.what()).find("disagree"), std::string::npos) << e.what();
  }
  c.all_reduce(x, flat, gc::ReduceOp::sum, s);
  s.synchronize();
  EXPECT_EQ(flat.data_as<float>()[0], static_cast<float>(n * (n - 1) / 2));
  EXPECT_FALSE(c.broken());
}

TEST(TransportCommunicator, EveryCollectiveOnFourRanksOfOneNode) {
  ::unsetenv("GPUCLOUD_LOCAL_SIZE");
  on_ranks(4, [](int r, auto t) { every_collective(r, t, 1); });
}

TEST(TransportCommunicator, HierarchicalOnTwoSimulatedNodesOfTwo) {
  ::setenv("GPUCLOUD_LOCAL_SIZE", "2", 1);
  on_ranks(4, [](int r, auto t) { every_collective(r, t, 2); });
  ::unsetenv("GPUCLOUD_LOCAL_SIZE");
}

TEST(TransportCommunicator, HierarchicalOverGroupsOfTwoInsideOneNode) {
  ::unsetenv("GPUCLOUD_LOCAL_SIZE");
  ::setenv("GPUCLOUD_HIERARCHY", "2", 1);  // a node of 4 split into 2 groups of 2 (split() made them)
  on_ranks(4, [](int r, auto t) {
    every_collective(r, t, 1);
    const gc::Hierarchy h = gc::Communicator::from_transport(t).hierarchy();
    EXPECT_EQ(h.level, "blocks of 2");
    EXPECT_EQ(h.groups, 2);
    EXPECT_EQ(h.group_rank, r % 2);
  });
  ::setenv("GPUCLOUD_HIERARCHY", "3", 1);  // does not divide the node: named, nothing made
  EXPECT_THROW(on_ranks(4, [](int, auto t) { (void)gc::Communicator::from_transport(t); }), gc::InvalidArgument);
  ::unsetenv("GPUCLOUD_HIERARCHY");
}

TEST(TransportCommunicator, WithoutTheAgreementEveryCollectiveStillHolds) {
  ::unsetenv("GPUCLOUD_LOCAL_SIZE");
  ::setenv("GPUCLOUD_COMM_CHECKS", "0", 1);
  on_ranks(4, [](int r, auto t) { every_collective(r, t, 1, /*checks=*/false); });
  ::setenv("GPUCLOUD_COMM_CHECKS", "yes", 1);
  EXPECT_THROW(on_ranks(1, [](int, auto t) { (void)gc::Communicator::from_transport(t); }), gc::InvalidArgument);
  ::unsetenv("GPUCLOUD_COMM_CHECKS");
}

TEST(TransportCommunicator, ATransportFailureIsACommunicationErrorNamingTheOperation) {
  ::unsetenv("GPUCLOUD_LOCAL_SIZE");
  on_ranks(1, [](int, auto t) {
    gc::Communicator c = gc::Communicator::from_transport(t);
    gc::Stream s;
    gc::Buffer x(8, gc::DType::float32);
    t->fail_ = true;
    c.all_reduce(x, x, gc::ReduceOp::sum, s);
    try {
      s.synchronize();
      ADD_FAILURE() << "the failure was lost";
    } catch (const gc::CommunicationError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("Communicator::all_reduce"), std::string::npos) << what;
      EXPECT_NE(what.find("the transport failed: connection reset by peer"), std::string::npos) << what;
    }
  });
}

TEST(TransportCommunicator, BadArgumentsAreTypedErrors) {
  EXPECT_THROW(gc::Communicator::from_transport(nullptr), gc::InvalidArgument);
  on_ranks(1, [](int, auto t) {
    gc::Communicator c = gc::Communicator::from_transport(t);
    gc::Stream s;
    gc::Buffer x(8, gc::DType::float32), y(9, gc::DType::float32), u(8, gc::DType::uint8);
    EXPECT_THROW(c.all_reduce(x, y, gc::ReduceOp::sum, s), gc::InvalidArgument);
    EXPECT_THROW(c.all_reduce(u, u, gc::ReduceOp::sum, s), gc::InvalidArgument);
    EXPECT_THROW(c.broadcast(x, 1, s), gc::InvalidArgument);
    s.synchronize();  // nothing was enqueued
  });
}

}  // namespace
