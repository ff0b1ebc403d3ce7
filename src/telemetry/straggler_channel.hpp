// The side channel of straggler detection: each rank sends the summary of every period it
// completes to rank 0 over a TCP connection of its own, and rank 0 sends every rank the latest
// summaries of all. After setup nothing blocks and the user's communicator is never touched, so
// ranks may record different numbers of steps, stop early or die.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace gpucloud::telemetry::detail {

/// One rank's summary of the last period it completed.
struct RankSummary {
  double step_seconds = 0;     ///< mean wall time per step
  double compute_seconds = 0;  ///< mean own work per step (less data wait and collectives)
  std::int64_t steps = 0;      ///< steps the rank had recorded at the period's end
};

/// Every rank's latest summary, as rank 0 last saw them.
struct SummaryTable {
  std::vector<RankSummary> ranks;  ///< by rank
  std::vector<bool> lost;          ///< the rank's connection closed (it ended, or died)
};

/// Where rank 0 listens, for the caller to hand to the other ranks (16 words: a broadcast).
struct Rendezvous {
  static constexpr std::size_t kWords = 16;
  static constexpr std::size_t kMaxAddresses = kWords - 3;
  std::array<std::int64_t, kWords> words{};  ///< token, port, address count, IPv4 addresses
};

class StragglerChannel {
 public:
  /// Rank 0 of @p size: listens on every IPv4 address (a port of the kernel's choosing) and
  /// describes itself in @p out. Throws CommunicationError when it cannot listen.
  static StragglerChannel host(int size, Rendezvous& out);
  /// Rank @p rank (> 0): connects to rank 0 through @p rendezvous, trying its addresses in order,
  /// and waits up to @p timeout_seconds for rank 0's welcome. Returns a channel that is not
  /// joined() with error() set when it could not.
  static StragglerChannel join(int rank, int size, const Rendezvous& rendezvous, double timeout_seconds);

  StragglerChannel(StragglerChannel&&) noexcept;
  StragglerChannel& operator=(StragglerChannel&&) noexcept;
  StragglerChannel(const StragglerChannel&) = delete;
  StragglerChannel& operator=(const StragglerChannel&) = delete;
  ~StragglerChannel();  ///< Closes every connection: rank 0 and the peers see the rank lost.

  /// Rank 0: accepts every other rank's connection (checking its token and rank; strangers are
  /// closed) within @p timeout_seconds, then stops listening. False, with error() naming the
  /// missing ranks, when some did not come.
  bool accept_peers(double timeout_seconds);
  /// Whether setup succeeded (always, on rank 0 after accept_peers returned true).
  bool joined() const noexcept { return joined_; }
  /// Why setup failed.
  const std::string& error() const noexcept { return error_; }

  /// Sends this rank's summary of the period it just completed (rank 0: keeps it). Never blocks:
  /// a summary that the kernel cannot take now waits in a small queue, or is dropped when rank 0
  /// has not read the earlier ones.
  void publish(const RankSummary& summary);
  /// Reads what arrived, without blocking. Rank 0: a new table when a summary arrived (its own
  /// included) and every rank not lost has sent one (the table is then sent to every rank);
  /// other ranks: the latest table rank 0 sent since the last call.
  std::optional<SummaryTable> poll();

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }

 private:
  struct Connection {
    int fd = -1;
    std::string in, out;  // bytes read and not yet parsed; bytes not yet sent
  };
  StragglerChannel(int rank, int size) : rank_(rank), size_(size) {}
  void close_all() noexcept;
  void lose(int peer) noexcept;
  bool flush(Connection& c) noexcept;      // false when the connection failed
  bool read_into(Connection& c) noexcept;  // false on end of stream or an error
  void send_table();

  int rank_ = 0, size_ = 1;
  bool joined_ = false;
  std::string error_;
  std::int64_t token_ = 0;
  int listen_fd_ = -1;
  std::vector<Connection> peers_;    // rank 0: by rank (its own unused); others: [0] is rank 0
  std::vector<RankSummary> latest_;  // rank 0: every rank's last summary
  std::vector<bool> heard_, lost_;
  bool changed_ = false;                  // rank 0: a summary arrived since the last table
  std::optional<SummaryTable> received_;  // others: the latest table not yet polled
};

}  // namespace gpucloud::telemetry::detail
