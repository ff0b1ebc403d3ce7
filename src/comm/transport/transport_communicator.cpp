// The transport backend of Communicator: gpucloud's collectives over a HostTransport's blocking
// host collectives (torch.distributed's gloo through gpucloud.torch.distributed, or a user's).
//
// As on MPI, every collective is a task on the caller's host stream, run under the
// communicator's order lock and its timeout (a watchdog abandons a stuck worker, the waiters get
// a CommunicationError and the communicator is broken), after one agreement all-reduce in which
// every rank states the collective (max and -min of six fields): a mismatch is an error on every
// rank, never a wrong result or a transport left waiting. The transport sees sum, max and min;
// average is a sum divided here, reduce-scatter an all-reduce of a copy, and the hierarchical
// all-reduce runs inside the nodes and across them on split transports.
#include <gpucloud/comm/communicator.hpp>
#include <gpucloud/comm/transport.hpp>
#include <gpucloud/runtime/error.hpp>

#include "comm/agreement.hpp"
#include "comm/communicator_impl.hpp"
#include "comm/hierarchy.hpp"
#include "comm/host_checks.hpp"
#include "comm/node_layout.hpp"
#include "runtime/host/deadline.hpp"
#include "runtime/nvtx.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

namespace gpucloud {

namespace {
// How the job ends after a collective timed out (CommunicationError's message).
constexpr const char* kEnds = "the process ends at exit, since the transport's call is still pending";
}  // namespace

namespace {

using detail::Collective;
using detail::Signature;

BufferView host_view(void* data, std::size_t count, DType dtype) {
  return BufferView(data, count, dtype, MemoryKind::host, Device::host());
}

void check_host(BufferView v, StreamView s, const char* call, const char* arg) {
  detail::check_host_buffer(v, s, call, arg, "a transport communicator");
}

// What the transport is asked for: average is a sum, divided afterwards.
ReduceOp transport_op(ReduceOp op) { return op == ReduceOp::average ? ReduceOp::sum : op; }

void copy_bytes(void* to, const void* from, std::size_t bytes) {
  if (to != from && bytes > 0) std::memmove(to, from, bytes);
}

class TransportCommunicator final : public Communicator::Impl,
                                    public std::enable_shared_from_this<TransportCommunicator> {
 public:
  std::shared_ptr<HostTransport> world, local, cross;  // local/cross: uniform nodes of several ranks
  bool checks = true;  // the agreement before each collective (GPUCLOUD_COMM_CHECKS=0: off)

  // Every rank states @p sig in one all-reduce (max of the fields and of their negations).
  void agree(const char* call, const Signature& sig) {
    std::int64_t fields[detail::kAgreementFields];
    detail::agreement_fields(sig, 0, fields);
    std::int64_t both[2 * detail::kAgreementFields];
    for (int i = 0; i < detail::kAgreementFields; ++i) {
      both[i] = fields[i];
      both[detail::kAgreementFields + i] = -fields[i];
    }
    world->all_reduce(host_view(both, 2 * detail::kAgreementFields, DType::int64), ReduceOp::max);
    detail::check_agreement(call, where, both, both + detail::kAgreementFields);
  }

  // The one way a collective is enqueued: on the stream's worker, in one order per communicator,
  // after the agreement, under the timeout; a transport's failure becomes a CommunicationError.
  template <class Body>
  void enqueue(StreamView stream, const char* call, Signature sig, Body body) {
    auto self = shared_from_this();
    launch_host_func(stream, [self, call, sig, body] {
      detail::NvtxRange range(call);
      self->check_usable(call);
      const auto began = std::chrono::steady_clock::now();
      detail::run_with_deadline(
          self->timeout,
          [&] {
            std::lock_guard<std::mutex> lock(self->order);
            self->check_usable(call);
            try {
              if (self->checks) self->agree(call, sig);
              body(*self);
            } catch (const Error&) {
              throw;
            } catch (const std::exception& e) {
              throw CommunicationError(call, self->where + ": the transport failed: " + e.what(), __FILE__, __LINE__);
            }
          },
          [&] { return self->timed_out(call, began, kEnds); });
      self->busy_ns.fetch_add(
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - began).count(),
          std::memory_order_relaxed);
    });
  }

  // recv = reduction of send over @p t's ranks (in place in recv).
  static void reduce_on(HostTransport& t, BufferView send, BufferView recv, ReduceOp op) {
    copy_bytes(recv.data(), send.data(), send.size_bytes());
    if (recv.size() > 0) t.all_reduce(recv, transport_op(op));
  }

  void all_reduce(BufferView send, BufferView recv, ReduceOp op, StreamView stream) override {
    constexpr const char* call = "Communicator::all_reduce";
    check_all_reduce(send, recv, op, stream, call);
    enqueue(stream, call, signature(Collective::all_reduce, op, recv), [send, recv, op](TransportCommunicator& c) {
      reduce_on(*c.world, send, recv, op);
      if (op == ReduceOp::average) detail::divide_in_place(recv, c.size);
    });
  }

  void hierarchical_all_reduce(BufferView send, BufferView recv, ReduceOp op, StreamView stream) override {
    constexpr const char* call = "Communicator::hierarchical_all_reduce";
    check_all_reduce(send, recv, op, stream, call);
    enqueue(stream, call, signature(Collective::hierarchical_all_reduce, op, recv),
            [send, recv, op](TransportCommunicator& c) {
              if (!c.local || !c.cross) {  // one node, or one rank per node: the flat all-reduce is it
                reduce_on(*c.world, send, recv, op);
              } else {
                // Inside the node, then this local rank's shard across the nodes, then the
                // shards gathered inside the node: the inter-node links carry 1/L of the data.
                reduce_on(*c.local, send, recv, op);
                const std::size_t n = recv.size(), L = static_cast<std::size_t>(c.grouping.group_size);
                const std::size_t shard = (n + L - 1) / L, elem = dtype_size(recv.dtype());
                const std::size_t begin = std::min(n, shard * static_cast<std::size_t>(c.grouping.group_rank));
                const std::size_t count = std::min(n, begin + shard) - begin;
                std::vector<unsigned char> gathered(shard * L * elem), mine(shard * elem, 0);
                if (shard > 0) {
                  BufferView part = host_view(mine.data(), shard, recv.dtype());
                  copy_bytes(mine.data(), static_cast<unsigned char*>(recv.data()) + begin * elem, count * elem);
                  c.cross->all_reduce(part, transport_op(op));  // padded shards: the same count on every rank
                  c.local->all_gather(part, host_view(gathered.data(), shard * L, recv.dtype()));
                  copy_bytes(recv.data(), gathered.data(), n * elem);
                }
              }
              if (op == ReduceOp::average) detail::divide_in_place(recv, c.size);
            });
  }

  void reduce_scatter(BufferView send, BufferView recv, ReduceOp op, StreamView stream) override {
    constexpr const char* call = "Communicator::reduce_scatter";
    check_host(send, stream, call, "send");
    check_host(recv, stream, call, "recv");
    detail::check_reducible(op, send.dtype(), call);
    enqueue(stream, call, signature(Collective::reduce_scatter, op, recv), [send, recv, op](TransportCommunicator& c) {
      std::vector<unsigned char> all(send.size_bytes());
      BufferView copy = host_view(all.data(), send.size(), send.dtype());
      reduce_on(*c.world, send, copy, op);
      copy_bytes(recv.data(), all.data() + recv.size_bytes() * static_cast<std::size_t>(c.rank), recv.size_bytes());
      if (op == ReduceOp::average) detail::divide_in_place(recv, c.size);
    });
  }

  void all_gather(BufferView send, BufferView recv, StreamView stream) override {
    constexpr const char* call = "Communicator::all_gather";
    check_host(send, stream, call, "send");
    check_host(recv, stream, call, "recv");
    enqueue(stream, call, signature(Collective::all_gather, std::nullopt, send),
            [send, recv](TransportCommunicator& c) {
              if (send.size() == 0) return;
              // The transport gets separate memory: send may be this rank's slot of recv (in place).
              std::vector<unsigned char> own(static_cast<const unsigned char*>(send.data()),
                                             static_cast<const unsigned char*>(send.data()) + send.size_bytes());
              c.world->all_gather(host_view(own.data(), send.size(), send.dtype()), recv);
            });
  }

  void broadcast(BufferView buffer, int root, StreamView stream) override {
    constexpr const char* call = "Communicator::broadcast";
    check_host(buffer, stream, call, "buffer");
    Signature sig = signature(Collective::broadcast, std::nullopt, buffer);
    sig.root = root;
    enqueue(stream, call, sig, [buffer, root](TransportCommunicator& c) {
      if (buffer.size() > 0) c.world->broadcast(buffer, root);
    });
  }

  void barrier(StreamView stream) override {
    constexpr const char* call = "Communicator::barrier";
    GPUCLOUD_EXPECTS(stream.device().is_host(), call, "stream: a transport communicator runs on host streams");
    enqueue(stream, call, Signature{Collective::barrier}, [](TransportCommunicator& c) {
      if (c.checks) return;  // the agreement was the barrier
      std::int64_t word = 0;
      c.world->all_reduce(host_view(&word, 1, DType::int64), ReduceOp::max);
    });
  }

  double time_all_reduce(bool intra, std::size_t bytes, int repeats) override {
    HostTransport& t = intra ? (local ? *local : *world) : (cross ? *cross : *world);
    std::vector<float> buf(std::max<std::size_t>(bytes / 4, 1));
    const BufferView v = host_view(buf.data(), buf.size(), DType::float32);
    t.all_reduce(v, ReduceOp::sum);
    double seconds = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < repeats; ++i) t.all_reduce(v, ReduceOp::sum);
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / repeats;
    world->all_reduce(host_view(&seconds, 1, DType::float64), ReduceOp::max);  // the slowest rank's time counts
    return seconds;
  }

 private:
  static Signature signature(Collective kind, std::optional<ReduceOp> op, BufferView v) {
    return Signature{kind, op ? static_cast<std::int64_t>(*op) : -1, -1, static_cast<std::int64_t>(v.size()),
                     static_cast<std::int64_t>(v.dtype())};
  }

  static void check_all_reduce(BufferView send, BufferView recv, ReduceOp op, StreamView stream, const char* call) {
    check_host(send, stream, call, "send");
    check_host(recv, stream, call, "recv");
    GPUCLOUD_EXPECTS(send.dtype() == recv.dtype() && send.size() == recv.size(), call,
                     "recv: must match send's dtype and size");
    detail::check_reducible(op, send.dtype(), call);
  }
};

}  // namespace

Communicator Communicator::from_transport(std::shared_ptr<HostTransport> transport) {
  constexpr const char* call = "Communicator::from_transport";
  GPUCLOUD_EXPECTS(transport != nullptr, call, "transport: null");
  auto c = std::make_shared<TransportCommunicator>();
  c->timeout = detail::timeout_from_environment();  // the environment first: a bad value changes nothing
  const detail::HierarchyRequest hierarchy = detail::hierarchy_from_environment(call);
  c->backend = CommBackend::transport;
  c->rank = transport->rank();
  c->size = transport->size();
  GPUCLOUD_EXPECTS(c->size >= 1 && c->rank >= 0 && c->rank < c->size, call,
                   "transport: rank " + std::to_string(c->rank) + " is outside its size " + std::to_string(c->size));
  if (const char* v = std::getenv("GPUCLOUD_COMM_CHECKS"); v != nullptr && *v != '\0') {
    const std::string text = v;
    GPUCLOUD_EXPECTS(text == "0" || text == "1", call,
                     "GPUCLOUD_COMM_CHECKS: '" + text + "' is not 0 (no agreement before collectives) or 1");
    c->checks = text == "1";
  }
  c->world = std::move(transport);
  c->where = detail::where(c->rank);
  detail::NodeLayout layout;
  if (const char* forced = std::getenv("GPUCLOUD_LOCAL_SIZE"); forced != nullptr && *forced != '\0') {
    layout = detail::block_layout(c->rank, c->size, detail::local_size_from_environment(forced, c->size, call));
  } else {
    std::vector<std::int64_t> keys(static_cast<std::size_t>(c->size));
    std::int64_t mine = static_cast<std::int64_t>(detail::host_key());
    c->world->all_gather(host_view(&mine, 1, DType::int64), host_view(keys.data(), keys.size(), DType::int64));
    layout = detail::node_layout(std::vector<std::uint64_t>(keys.begin(), keys.end()), c->rank);
  }
  c->local_rank = layout.local_rank;
  c->local_size = layout.local_size;
  c->node = layout.node;
  c->nodes = layout.nodes;
  c->uniform_nodes = layout.uniform;
  c->use_nodes_as_groups();
  detail::check_blocks(hierarchy, c->local_size, c->uniform_nodes, call);
  if (hierarchy.kind == detail::HierarchyRequest::Kind::numa ||
      hierarchy.kind == detail::HierarchyRequest::Kind::blocks) {
    // Host memory: the node is the group unless NUMA nodes or blocks of local ranks are asked for.
    std::int64_t mine[2] = {c->node, detail::local_subgroup_key(hierarchy, -1, c->local_rank)};
    std::vector<std::int64_t> all(2 * static_cast<std::size_t>(c->size));
    c->world->all_gather(host_view(mine, 2, DType::int64), host_view(all.data(), all.size(), DType::int64));
    if (const auto g = detail::group_layout_of_pairs(all, c->rank)) {
      c->grouping =
          Hierarchy{detail::hierarchy_level(hierarchy, true), g->node, g->nodes, g->local_rank, g->local_size};
    }
  }
  const Hierarchy& g = c->grouping;
  if (g.groups > 1 && c->uniform_groups && g.group_size > 1) {  // the same decision on every rank
    c->local = c->world->split(g.group, c->rank);
    c->cross = c->world->split(g.group_rank, c->rank);
    GPUCLOUD_EXPECTS(c->local && c->cross && c->local->size() == g.group_size && c->cross->size() == g.groups, call,
                     "transport: split() returned groups of the wrong size");
  }
  // A transport call abandoned at a timeout may never return: the process then ends at exit
  // (saying why) instead of waiting for it.
  static std::once_flag at_exit;
  std::call_once(at_exit, [] { std::atexit([] { detail::end_job_if_communicator_broke(); }); });
  return Communicator(std::move(c));
}

}  // namespace gpucloud
