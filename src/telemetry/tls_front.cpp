#include "telemetry/tls_front.hpp"

#include <gpucloud/runtime/error.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <system_error>
#include <thread>

namespace gpucloud::telemetry::detail {

namespace {

constexpr const char* kCall = "Exporter";

std::string ssl_error() {
  const unsigned long e = ERR_get_error();
  char text[256] = "unknown OpenSSL error";
  if (e != 0) ERR_error_string_n(e, text, sizeof text);
  ERR_clear_error();
  return text;
}

bool write_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

void set_timeouts(int fd, std::chrono::milliseconds t) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(t.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((t.count() % 1000) * 1000);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

}  // namespace

bool allowed(const std::string& ip, const std::vector<std::string>& allow) {
  if (allow.empty()) return true;
  in_addr peer{};
  if (::inet_pton(AF_INET, ip.c_str(), &peer) != 1) return false;
  const std::uint32_t p = ntohl(peer.s_addr);
  for (const auto& entry : allow) {
    const auto slash = entry.find('/');
    in_addr net{};
    if (::inet_pton(AF_INET, entry.substr(0, slash).c_str(), &net) != 1) continue;
    const int bits = slash == std::string::npos ? 32 : std::stoi(entry.substr(slash + 1));
    const std::uint32_t mask = bits == 0 ? 0 : ~std::uint32_t{0} << (32 - bits);
    if ((p & mask) == (ntohl(net.s_addr) & mask)) return true;
  }
  return false;
}

struct TlsFront::Impl {
  TlsFrontOptions options;
  SSL_CTX* ctx = nullptr;
  int listen_fd = -1;
  int wake[2] = {-1, -1};
  int port = 0;
  std::atomic<bool> stopping{false};
  std::thread acceptor;
  std::mutex mutex;
  std::condition_variable cv;
  int active = 0;  // connection threads running (detached; waited for by the destructor)

  ~Impl() {
    if (ctx != nullptr) SSL_CTX_free(ctx);
    for (int fd : {listen_fd, wake[0], wake[1]}) {
      if (fd >= 0) ::close(fd);
    }
  }

  void accept_loop() {
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex);  // at most `threads` connections at once
        cv.wait(lock, [&] { return stopping || active < options.threads; });
      }
      if (stopping) return;
      pollfd fds[2] = {{listen_fd, POLLIN, 0}, {wake[0], POLLIN, 0}};
      if (::poll(fds, 2, -1) < 0 && errno != EINTR) return;
      if (stopping) return;
      if ((fds[0].revents & POLLIN) == 0) continue;
      sockaddr_storage peer{};
      socklen_t len = sizeof peer;
      const int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&peer), &len, SOCK_CLOEXEC);
      if (fd < 0) continue;
      if (!allowed(peer_ip(peer), options.allow)) {
        ::close(fd);
        continue;
      }
      {
        std::lock_guard<std::mutex> lock(mutex);
        ++active;
      }
      try {
        std::thread([this, fd] {
          serve(fd);
          std::lock_guard<std::mutex> lock(mutex);
          --active;
          cv.notify_all();
        }).detach();
      } catch (const std::system_error&) {  // no thread to be had: this client is turned away
        ::close(fd);
        std::lock_guard<std::mutex> lock(mutex);
        --active;
      }
    }
  }

  static std::string peer_ip(const sockaddr_storage& peer) {
    char text[INET6_ADDRSTRLEN] = {};
    if (peer.ss_family == AF_INET) {
      ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(peer).sin_addr, text, sizeof text);
      return text;
    }
    const auto& a6 = reinterpret_cast<const sockaddr_in6&>(peer).sin6_addr;
    if (IN6_IS_ADDR_V4MAPPED(&a6)) {
      ::inet_ntop(AF_INET, a6.s6_addr + 12, text, sizeof text);
      return text;
    }
    ::inet_ntop(AF_INET6, &a6, text, sizeof text);
    return text;
  }

  int connect_backend() const {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<std::uint16_t>(options.backend_port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      ::close(fd);
      return -1;
    }
    return fd;
  }

  // One client: the handshake and its requests bounded by idle_timeout, bytes forwarded both ways.
  void serve(int fd) {
    // OpenSSL writes with write(): a client gone mid-response must be EPIPE, not a SIGPIPE that
    // ends the process (a signal caused by a write is the writing thread's, so blocking it here
    // is enough).
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
    set_timeouts(fd, options.idle_timeout);
    SSL* ssl = SSL_new(ctx);
    int back = -1;
    if (ssl != nullptr && SSL_set_fd(ssl, fd) == 1 && SSL_accept(ssl) == 1 && (back = connect_backend()) >= 0) {
      char buf[16384];
      auto idle = std::chrono::steady_clock::now();
      while (!stopping) {
        if (SSL_pending(ssl) == 0) {
          pollfd fds[2] = {{fd, POLLIN, 0}, {back, POLLIN, 0}};
          const int n = ::poll(fds, 2, 100);
          if (n < 0 && errno != EINTR) break;
          if (n <= 0) {
            if (std::chrono::steady_clock::now() - idle > options.idle_timeout) break;
            continue;
          }
          if (fds[1].revents & (POLLIN | POLLHUP | POLLERR)) {
            const ssize_t r = ::recv(back, buf, sizeof buf, 0);
            if (r <= 0 || SSL_write(ssl, buf, static_cast<int>(r)) != r) break;
          }
          if ((fds[0].revents & (POLLIN | POLLHUP | POLLERR)) == 0) {
            idle = std::chrono::steady_clock::now();
            continue;
          }
        }
        const int r = SSL_read(ssl, buf, sizeof buf);
        if (r <= 0 || !write_all(back, buf, static_cast<std::size_t>(r))) break;
        idle = std::chrono::steady_clock::now();
      }
    }
    if (ssl != nullptr) {
      SSL_shutdown(ssl);
      SSL_free(ssl);
    }
    ERR_clear_error();
    if (back >= 0) ::close(back);
    ::close(fd);
  }
};

std::unique_ptr<TlsFront> TlsFront::start(const TlsFrontOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->ctx = SSL_CTX_new(TLS_server_method());
  if (impl->ctx == nullptr) throw Error(kCall, "SSL_CTX_new: " + ssl_error(), __FILE__, __LINE__);
  SSL_CTX_set_min_proto_version(impl->ctx, TLS1_2_VERSION);
  GPUCLOUD_EXPECTS(SSL_CTX_use_certificate_chain_file(impl->ctx, options.cert_file.c_str()) == 1, kCall,
                   "options.tls_cert_file: '" + options.cert_file + "': " + ssl_error());
  GPUCLOUD_EXPECTS(SSL_CTX_use_PrivateKey_file(impl->ctx, options.key_file.c_str(), SSL_FILETYPE_PEM) == 1, kCall,
                   "options.tls_key_file: '" + options.key_file + "': " + ssl_error());
  GPUCLOUD_EXPECTS(
      SSL_CTX_check_private_key(impl->ctx) == 1, kCall,
      "options.tls_key_file: the key does not match the certificate of options.tls_cert_file (" + ssl_error() + ")");
  // The listener.
  sockaddr_storage addr{};
  socklen_t len = 0;
  int family = AF_INET;
  auto* a4 = reinterpret_cast<sockaddr_in*>(&addr);
  auto* a6 = reinterpret_cast<sockaddr_in6*>(&addr);
  if (::inet_pton(AF_INET, options.address.c_str(), &a4->sin_addr) == 1) {
    a4->sin_family = AF_INET;
    a4->sin_port = htons(static_cast<std::uint16_t>(options.port));
    len = sizeof(sockaddr_in);
  } else if (::inet_pton(AF_INET6, options.address.c_str(), &a6->sin6_addr) == 1) {
    family = AF_INET6;
    a6->sin6_family = AF_INET6;
    a6->sin6_port = htons(static_cast<std::uint16_t>(options.port));
    len = sizeof(sockaddr_in6);
  } else {
    GPUCLOUD_FAIL(InvalidArgument, kCall, "options.address: '" + options.address + "' is not an IP address");
  }
  impl->listen_fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (impl->listen_fd < 0) throw Error(kCall, std::string("socket: ") + std::strerror(errno), __FILE__, __LINE__);
  const int one = 1;
  ::setsockopt(impl->listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(impl->listen_fd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || ::listen(impl->listen_fd, 64) != 0) {
    GPUCLOUD_FAIL(InvalidArgument, kCall,
                  "options.port: cannot serve on " + options.address + ":" + std::to_string(options.port) + " (" +
                      std::strerror(errno) + ")");
  }
  sockaddr_storage bound{};
  socklen_t bound_len = sizeof bound;
  ::getsockname(impl->listen_fd, reinterpret_cast<sockaddr*>(&bound), &bound_len);
  impl->port = ntohs(family == AF_INET ? reinterpret_cast<sockaddr_in&>(bound).sin_port
                                       : reinterpret_cast<sockaddr_in6&>(bound).sin6_port);
  if (::pipe2(impl->wake, O_CLOEXEC) != 0) {
    throw Error(kCall, std::string("pipe2: ") + std::strerror(errno), __FILE__, __LINE__);
  }
  Impl* raw = impl.get();
  impl->acceptor = std::thread([raw] { raw->accept_loop(); });
  return std::unique_ptr<TlsFront>(new TlsFront(std::move(impl)));
}

TlsFront::TlsFront(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

TlsFront::~TlsFront() {
  impl_->stopping = true;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    impl_->cv.notify_all();
  }
  const char c = 1;
  (void)::write(impl_->wake[1], &c, 1);
  if (impl_->acceptor.joinable()) impl_->acceptor.join();
  std::unique_lock<std::mutex> lock(impl_->mutex);
  impl_->cv.wait(lock, [&] { return impl_->active == 0; });  // each sees `stopping` within 100 ms
}

int TlsFront::port() const { return impl_->port; }

}  // namespace gpucloud::telemetry::detail
