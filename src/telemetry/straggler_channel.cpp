#include "telemetry/straggler_channel.hpp"

#include <gpucloud/runtime/error.hpp>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <random>
#include <utility>

namespace gpucloud::telemetry::detail {
namespace {

// Messages, in the machine's byte order (every rank of a job runs the same build):
//   hello   (rank r -> 0)  magic, rank, token                              16 bytes
//   welcome (0 -> rank r)  magic, size, token                              16 bytes
//   summary (rank r -> 0)  magic, rank, steps, step s, compute s           32 bytes
//   table   (0 -> rank r)  magic, size, then per rank: steps, step s, compute s, flags   8 + 32 n
constexpr std::uint32_t kHello = 0x31484347, kWelcome = 0x31574347, kSummary = 0x31534347, kTable = 0x31544347;
constexpr std::size_t kHandshakeBytes = 16, kSummaryBytes = 32, kRowBytes = 32, kTableHeader = 8;
constexpr std::size_t kMaxQueued = 4096;  // bytes waiting for a slow reader before summaries are dropped
constexpr std::int64_t kHeard = 1, kLost = 2;

using Clock = std::chrono::steady_clock;

template <class T>
void put(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));
  out.append(bytes, sizeof(T));
}

template <class T>
T get(const std::string& in, std::size_t offset) {
  T value;
  std::memcpy(&value, in.data() + offset, sizeof(T));
  return value;
}

std::string handshake(std::uint32_t magic, std::int32_t who, std::int64_t token) {
  std::string m;
  put(m, magic);
  put(m, who);
  put(m, token);
  return m;
}

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left <= 0 ? 0 : static_cast<int>(std::min<long long>(left, 1 << 30));
}

Clock::time_point after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

void set_options(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));  // a summary is one small message
}

// This host's IPv4 addresses that are up, loopback last (rank 0 shares a node with some ranks).
std::vector<std::uint32_t> local_addresses() {
  std::vector<std::uint32_t> outside, loopback;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) == 0) {
    for (const ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
      if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET || (a->ifa_flags & IFF_UP) == 0) continue;
      const std::uint32_t ip = reinterpret_cast<const sockaddr_in*>(a->ifa_addr)->sin_addr.s_addr;
      ((a->ifa_flags & IFF_LOOPBACK) != 0 ? loopback : outside).push_back(ip);
    }
    ::freeifaddrs(list);
  }
  outside.insert(outside.end(), loopback.begin(), loopback.end());
  if (outside.empty()) outside.push_back(htonl(INADDR_LOOPBACK));
  return outside;
}

std::string dotted(std::uint32_t ip) {
  char text[INET_ADDRSTRLEN] = {};
  in_addr a{};
  a.s_addr = ip;
  ::inet_ntop(AF_INET, &a, text, sizeof(text));
  return text;
}

// Connects to @p ip:@p port within @p ms; a non-blocking descriptor, or -1 with @p why set.
int connect_within(std::uint32_t ip, int port, int ms, std::string& why) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    why = std::string("socket: ") + std::strerror(errno);
    return -1;
  }
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<std::uint16_t>(port));
  to.sin_addr.s_addr = ip;
  int error = 0;
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&to), sizeof(to)) != 0) {
    error = errno;
    if (error == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      const int ready = ::poll(&p, 1, ms);
      socklen_t len = sizeof(error);
      if (ready <= 0) {
        error = ready == 0 ? ETIMEDOUT : errno;
      } else if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) != 0) {
        error = errno;
      }
    }
  }
  if (error != 0) {
    why = std::strerror(error);
    ::close(fd);
    return -1;
  }
  set_options(fd);
  return fd;
}

}  // namespace

StragglerChannel StragglerChannel::host(int size, Rendezvous& out) {
  constexpr const char* call = "StragglerChannel::host";
  StragglerChannel c(0, size);
  c.peers_.resize(static_cast<std::size_t>(size));
  c.latest_.resize(static_cast<std::size_t>(size));
  c.heard_.assign(static_cast<std::size_t>(size), false);
  c.lost_.assign(static_cast<std::size_t>(size), false);
  std::random_device entropy;
  c.token_ = (static_cast<std::int64_t>(entropy()) << 32) ^ static_cast<std::int64_t>(entropy());
  out.words.fill(0);
  out.words[0] = c.token_;
  if (size > 1) {
    c.listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c.listen_fd_ < 0)
      throw CommunicationError(call, std::string("socket: ") + std::strerror(errno), __FILE__, __LINE__);
    sockaddr_in any{};
    any.sin_family = AF_INET;
    any.sin_addr.s_addr = htonl(INADDR_ANY);
    socklen_t len = sizeof(any);
    if (::bind(c.listen_fd_, reinterpret_cast<const sockaddr*>(&any), sizeof(any)) != 0 ||
        ::listen(c.listen_fd_, SOMAXCONN) != 0 ||
        ::getsockname(c.listen_fd_, reinterpret_cast<sockaddr*>(&any), &len) != 0) {
      throw CommunicationError(call, std::string("listening for the other ranks: ") + std::strerror(errno), __FILE__,
                               __LINE__);
    }
    out.words[1] = ntohs(any.sin_port);
    const auto addresses = local_addresses();
    const std::size_t n = std::min(addresses.size(), Rendezvous::kMaxAddresses);
    out.words[2] = static_cast<std::int64_t>(n);
    for (std::size_t i = 0; i < n; ++i) out.words[3 + i] = addresses[i];
  }
  c.joined_ = size == 1;
  return c;
}

StragglerChannel StragglerChannel::join(int rank, int size, const Rendezvous& r, double timeout_seconds) {
  StragglerChannel c(rank, size);
  c.token_ = r.words[0];
  c.peers_.resize(1);
  c.lost_.assign(1, false);
  const int port = static_cast<int>(r.words[1]);
  const auto count = static_cast<std::size_t>(std::max<std::int64_t>(
      0, std::min<std::int64_t>(r.words[2], static_cast<std::int64_t>(Rendezvous::kMaxAddresses))));
  const auto deadline = after(timeout_seconds);
  std::string tried;
  for (std::size_t i = 0; i < count && !c.joined_; ++i) {
    const auto ip = static_cast<std::uint32_t>(r.words[3 + i]);
    std::string why;
    // A few seconds per address, so an unreachable one leaves time for the next.
    Connection link;
    link.fd = connect_within(ip, port, std::min(remaining_ms(deadline), 3000), why);
    if (link.fd >= 0) {
      link.out = handshake(kHello, rank, c.token_);
      while (!link.out.empty() && c.flush(link) && remaining_ms(deadline) > 0) {
        pollfd p{link.fd, POLLOUT, 0};
        if (!link.out.empty()) ::poll(&p, 1, remaining_ms(deadline));
      }
      bool open = link.out.empty();
      while (open && link.in.size() < kHandshakeBytes && remaining_ms(deadline) > 0) {
        pollfd p{link.fd, POLLIN, 0};
        if (::poll(&p, 1, remaining_ms(deadline)) > 0) open = c.read_into(link) || link.in.size() >= kHandshakeBytes;
      }
      if (link.in.size() >= kHandshakeBytes && get<std::uint32_t>(link.in, 0) == kWelcome &&
          get<std::int32_t>(link.in, 4) == size && get<std::int64_t>(link.in, 8) == c.token_) {
        link.in.erase(0, kHandshakeBytes);
        c.peers_[0] = std::move(link);
        c.joined_ = true;
        break;
      }
      why = link.in.size() >= kHandshakeBytes ? "a stranger answered"
                                              : (open ? "no welcome in time" : "closed before the welcome");
      ::close(link.fd);
    }
    tried += (tried.empty() ? "" : ", ") + dotted(ip) + ":" + std::to_string(port) + " (" + why + ")";
  }
  if (!c.joined_)
    c.error_ = "rank " + std::to_string(rank) + " could not reach rank 0 at " + (tried.empty() ? "no address" : tried);
  return c;
}

bool StragglerChannel::accept_peers(double timeout_seconds) {
  const auto deadline = after(timeout_seconds);
  std::vector<Connection> pending;  // accepted, not yet identified
  int joined = 1;
  while (joined < size_ && remaining_ms(deadline) > 0) {
    std::vector<pollfd> fds{{listen_fd_, POLLIN, 0}};
    for (const Connection& p : pending) fds.push_back({p.fd, POLLIN, 0});
    if (::poll(fds.data(), fds.size(), remaining_ms(deadline)) <= 0) continue;
    for (std::size_t i = pending.size(); i-- > 0;) {
      if (fds[i + 1].revents == 0) continue;
      Connection& p = pending[i];
      const bool open = read_into(p);
      if (p.in.size() < kHandshakeBytes && open) continue;
      const auto who = p.in.size() >= kHandshakeBytes ? get<std::int32_t>(p.in, 4) : -1;
      bool valid = p.in.size() >= kHandshakeBytes && get<std::uint32_t>(p.in, 0) == kHello &&
                   get<std::int64_t>(p.in, 8) == token_ && who > 0 && who < size_ &&
                   peers_[static_cast<std::size_t>(who)].fd < 0;
      if (valid) {
        p.in.erase(0, kHandshakeBytes);
        p.out = handshake(kWelcome, size_, token_);
        valid = flush(p) && p.out.empty();
      }
      if (valid) {
        peers_[static_cast<std::size_t>(who)] = std::move(p);
        ++joined;
      } else {
        ::close(p.fd);  // a stranger, a wrong token, a duplicate rank, or gone before its hello
      }
      pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
    }
    if (fds[0].revents != 0) {
      for (int fd; (fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0;) {
        set_options(fd);
        Connection p;
        p.fd = fd;
        pending.push_back(std::move(p));
      }
    }
  }
  for (Connection& p : pending) ::close(p.fd);
  ::close(listen_fd_);
  listen_fd_ = -1;
  joined_ = joined == size_;
  if (!joined_) {
    std::string missing;
    for (int r = 1; r < size_; ++r) {
      if (peers_[static_cast<std::size_t>(r)].fd < 0) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
    error_ = "rank 0 heard nothing from rank(s) " + missing + " within " + std::to_string(timeout_seconds) + " s";
  }
  return joined_;
}

StragglerChannel::StragglerChannel(StragglerChannel&& o) noexcept { *this = std::move(o); }

StragglerChannel& StragglerChannel::operator=(StragglerChannel&& o) noexcept {
  if (this != &o) {
    close_all();
    rank_ = o.rank_;
    size_ = o.size_;
    joined_ = o.joined_;
    error_ = std::move(o.error_);
    token_ = o.token_;
    listen_fd_ = std::exchange(o.listen_fd_, -1);
    peers_ = std::move(o.peers_);
    o.peers_.clear();
    latest_ = std::move(o.latest_);
    heard_ = std::move(o.heard_);
    lost_ = std::move(o.lost_);
    changed_ = o.changed_;
    received_ = std::move(o.received_);
  }
  return *this;
}

StragglerChannel::~StragglerChannel() { close_all(); }

void StragglerChannel::close_all() noexcept {
  for (Connection& p : peers_) {
    if (p.fd >= 0) ::close(p.fd);
    p.fd = -1;
  }
  if (listen_fd_ >= 0) ::close(listen_fd_);
  listen_fd_ = -1;
}

void StragglerChannel::lose(int peer) noexcept {
  Connection& p = peers_[static_cast<std::size_t>(peer)];
  if (p.fd >= 0) ::close(p.fd);
  p.fd = -1;
  p.in.clear();
  p.out.clear();
  lost_[static_cast<std::size_t>(peer)] = true;
  changed_ = true;
}

bool StragglerChannel::flush(Connection& c) noexcept {
  while (!c.out.empty()) {
    const ssize_t sent = ::send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent > 0) {
      c.out.erase(0, static_cast<std::size_t>(sent));
    } else if (sent < 0 && errno == EINTR) {
      continue;
    } else {
      return sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);  // full: the rest waits
    }
  }
  return true;
}

bool StragglerChannel::read_into(Connection& c) noexcept {
  char chunk[16384];
  for (;;) {
    const ssize_t got = ::recv(c.fd, chunk, sizeof(chunk), MSG_DONTWAIT);
    if (got > 0) {
      c.in.append(chunk, static_cast<std::size_t>(got));
      if (c.in.size() > (std::size_t{1} << 24)) return false;  // nobody honest sends this much unread
    } else if (got < 0 && errno == EINTR) {
      continue;
    } else {
      return got < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
    }
  }
}

void StragglerChannel::publish(const RankSummary& s) {
  if (rank_ == 0) {
    latest_[0] = s;
    heard_[0] = true;
    changed_ = true;
    return;
  }
  Connection& link = peers_[0];
  if (!joined_ || link.fd < 0 || link.out.size() >= kMaxQueued) return;  // rank 0 gone, or not reading
  put(link.out, kSummary);
  put(link.out, static_cast<std::int32_t>(rank_));
  put(link.out, s.steps);
  put(link.out, s.step_seconds);
  put(link.out, s.compute_seconds);
  if (!flush(link)) lose(0);
}

void StragglerChannel::send_table() {
  std::string table;
  put(table, kTable);
  put(table, static_cast<std::int32_t>(size_));
  for (std::size_t r = 0; r < latest_.size(); ++r) {
    put(table, latest_[r].steps);
    put(table, latest_[r].step_seconds);
    put(table, latest_[r].compute_seconds);
    put(table, (heard_[r] ? kHeard : 0) | (lost_[r] ? kLost : 0));
  }
  for (int r = 1; r < size_; ++r) {
    Connection& p = peers_[static_cast<std::size_t>(r)];
    if (p.fd < 0) continue;
    if (p.out.size() < kMaxQueued) p.out += table;  // a rank that does not read misses tables
    if (!flush(p)) lose(r);
  }
}

std::optional<SummaryTable> StragglerChannel::poll() {
  if (!joined_) return std::nullopt;
  std::vector<pollfd> fds;
  std::vector<int> who;
  for (std::size_t r = 0; r < peers_.size(); ++r) {
    if (peers_[r].fd < 0) continue;
    fds.push_back({peers_[r].fd, static_cast<short>(POLLIN | (peers_[r].out.empty() ? 0 : POLLOUT)), 0});
    who.push_back(static_cast<int>(r));
  }
  if (!fds.empty() && ::poll(fds.data(), fds.size(), 0) > 0) {
    for (std::size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      const int peer = who[i];
      Connection& p = peers_[static_cast<std::size_t>(peer)];
      if ((fds[i].revents & POLLOUT) != 0 && !flush(p)) {
        lose(peer);
        continue;
      }
      const bool open = (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0 || read_into(p);
      bool valid = true;
      if (rank_ == 0) {  // summaries from rank `peer`
        std::size_t at = 0;
        for (; valid && p.in.size() - at >= kSummaryBytes; at += kSummaryBytes) {
          valid = get<std::uint32_t>(p.in, at) == kSummary && get<std::int32_t>(p.in, at + 4) == peer;
          if (!valid) break;
          RankSummary& s = latest_[static_cast<std::size_t>(peer)];
          s.steps = get<std::int64_t>(p.in, at + 8);
          s.step_seconds = get<double>(p.in, at + 16);
          s.compute_seconds = get<double>(p.in, at + 24);
          heard_[static_cast<std::size_t>(peer)] = true;
          changed_ = true;
        }
        if (valid) p.in.erase(0, at);
      } else {  // tables from rank 0
        const std::size_t bytes = kTableHeader + kRowBytes * static_cast<std::size_t>(size_);
        while (valid && p.in.size() >= kTableHeader) {
          valid = get<std::uint32_t>(p.in, 0) == kTable && get<std::int32_t>(p.in, 4) == size_;
          if (!valid || p.in.size() < bytes) break;
          SummaryTable t;
          for (int r = 0; r < size_; ++r) {
            const std::size_t row = kTableHeader + kRowBytes * static_cast<std::size_t>(r);
            t.ranks.push_back({get<double>(p.in, row + 8), get<double>(p.in, row + 16), get<std::int64_t>(p.in, row)});
            t.lost.push_back((get<std::int64_t>(p.in, row + 24) & kLost) != 0);
          }
          received_ = std::move(t);
          p.in.erase(0, bytes);
        }
      }
      if (!valid || !open) lose(peer);  // garbage is treated as a peer gone: it is closed
    }
  }
  if (rank_ != 0) return std::exchange(received_, std::nullopt);
  if (!changed_) return std::nullopt;
  for (int r = 0; r < size_; ++r) {
    if (!heard_[static_cast<std::size_t>(r)] && !lost_[static_cast<std::size_t>(r)]) return std::nullopt;
  }
  changed_ = false;
  send_table();
  return SummaryTable{latest_, lost_};
}

}  // namespace gpucloud::telemetry::detail
