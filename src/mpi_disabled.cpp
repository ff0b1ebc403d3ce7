// Communicator without MPI: mpi_world() says so; nothing else is reachable.
#include <gpucloud/communicator.hpp>
#include <gpucloud/error.hpp>

namespace gpucloud {

struct Communicator::Impl {};

Communicator::Communicator(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Communicator::~Communicator() = default;
Communicator::Communicator(Communicator&&) noexcept = default;
Communicator& Communicator::operator=(Communicator&&) noexcept = default;

Communicator Communicator::mpi_world() {
  GPUCLOUD_FAIL(Unsupported, "Communicator::mpi_world", "gpucloud was built without MPI (install libopenmpi-dev)");
}

Communicator Communicator::mpi(std::int64_t) {
  GPUCLOUD_FAIL(Unsupported, "Communicator::mpi", "gpucloud was built without MPI (install libopenmpi-dev)");
}

int Communicator::rank() const noexcept { return 0; }
int Communicator::size() const noexcept { return 1; }
int Communicator::local_rank() const noexcept { return 0; }
int Communicator::local_size() const noexcept { return 1; }
int Communicator::node() const noexcept { return 0; }
int Communicator::nodes() const noexcept { return 1; }
std::chrono::milliseconds Communicator::timeout() const noexcept { return std::chrono::milliseconds(0); }
bool Communicator::broken() const noexcept { return true; }
void Communicator::set_timeout(std::chrono::milliseconds) {}
void Communicator::all_reduce(BufferView, BufferView, ReduceOp, StreamView) {}
void Communicator::hierarchical_all_reduce(BufferView, BufferView, ReduceOp, StreamView) {}
void Communicator::reduce_scatter(BufferView, BufferView, ReduceOp, StreamView) {}
void Communicator::all_gather(BufferView, BufferView, StreamView) {}
void Communicator::broadcast(BufferView, int, StreamView) {}
void Communicator::barrier(StreamView) {}
AllReduceCostModel Communicator::measure_cost_model(StreamView) { return AllReduceCostModel{}; }
void Communicator::set_cost_model(const AllReduceCostModel&) {}
void Communicator::all_reduce_auto(BufferView, BufferView, ReduceOp, StreamView) {}

}  // namespace gpucloud
