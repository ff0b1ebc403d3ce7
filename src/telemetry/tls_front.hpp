// HTTPS for the metrics endpoint: a TLS listener (OpenSSL) in front of the exporter's plain HTTP
// server, which then listens on loopback only. civetweb 1.15 as Debian 12 builds it loads OpenSSL
// by name and cannot initialise OpenSSL 3 (a worker calls a null function on the first TLS
// connection), so TLS is terminated here instead (docs/telemetry.md#securing-the-endpoint).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace gpucloud::telemetry::detail {

/// What a TlsFront serves.
struct TlsFrontOptions {
  std::string address;                           ///< IPv4 or IPv6 address to bind
  int port = 0;                                  ///< 0 picks one
  std::string cert_file, key_file;               ///< PEM certificate (chain) and private key
  std::vector<std::string> allow;                ///< IPv4 CIDR blocks allowed (empty: all)
  int threads = 8;                               ///< connections served at once (more wait)
  std::chrono::milliseconds idle_timeout{5000};  ///< a connection silent this long is closed
  int backend_port = 0;                          ///< the plain HTTP server on 127.0.0.1
};

/// A TLS listener forwarding each connection to the plain server. Move-only through unique_ptr.
class TlsFront {
 public:
  /// Loads the certificate and key (InvalidArgument naming the option when they are unreadable or
  /// do not match), binds (InvalidArgument when the port is in use) and starts accepting.
  static std::unique_ptr<TlsFront> start(const TlsFrontOptions& options);
  /// Stops accepting, closes every connection, joins every thread.
  ~TlsFront();
  TlsFront(const TlsFront&) = delete;
  TlsFront& operator=(const TlsFront&) = delete;
  /// The port it listens on.
  int port() const;

  struct Impl;

 private:
  explicit TlsFront(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// True when IPv4 address @p ip (dotted) is inside one of the CIDR blocks @p allow (already checked).
bool allowed(const std::string& ip, const std::vector<std::string>& allow);

}  // namespace gpucloud::telemetry::detail
