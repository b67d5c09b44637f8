// The static-file server behind `attn explore` (static_server.hpp), on POSIX sockets.
#include "static_server.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>

namespace attn::cli {
namespace {

bool ends_with(const std::string& s, const char* suffix) {
  const std::size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

bool safe_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' ||
         c == '-' || c == '/';
}

// Writes all of `data`; a client that went away is not an error worth more than dropping it.
void send_all(int fd, const std::string& data) {
  std::size_t off = 0;
  while (off < data.size()) {
    const ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return;
    off += static_cast<std::size_t>(n);
  }
}

void respond(int fd, int code, const char* reason, const std::string& type, const std::string& body, bool head) {
  std::ostringstream h;
  h << "HTTP/1.1 " << code << ' ' << reason << "\r\nContent-Type: " << type << "\r\nContent-Length: " << body.size()
    << "\r\nCache-Control: no-cache\r\nX-Content-Type-Options: nosniff\r\nConnection: close\r\n\r\n";
  send_all(fd, h.str());
  if (!head) send_all(fd, body);
}

// Reads the request head (up to the blank line, at most 16 KiB; the client has 5 s to send it).
std::string read_head(int fd) {
  std::string req;
  char buf[2048];
  while (req.size() < 16384 && req.find("\r\n\r\n") == std::string::npos) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    req.append(buf, static_cast<std::size_t>(n));
  }
  return req;
}

void handle(int fd, const std::string& root) {
  const std::string req = read_head(fd);
  std::istringstream line(req.substr(0, req.find("\r\n")));
  std::string method, target, version;
  line >> method >> target >> version;
  if (version.rfind("HTTP/", 0) != 0) return respond(fd, 400, "Bad Request", "text/plain", "bad request\n", false);
  const bool head = method == "HEAD";
  if (method != "GET" && !head)
    return respond(fd, 405, "Method Not Allowed", "text/plain", "only GET and HEAD\n", head);
  const std::string path = resolve_target(root, target);
  std::ifstream in(path, std::ios::binary);
  if (path.empty() || !in) return respond(fd, 404, "Not Found", "text/plain", "not found\n", head);
  std::ostringstream body;
  body << in.rdbuf();
  respond(fd, 200, "OK", mime_type(path), body.str(), head);
}

}  // namespace

std::string mime_type(const std::string& path) {
  if (ends_with(path, ".html")) return "text/html; charset=utf-8";
  if (ends_with(path, ".js")) return "text/javascript; charset=utf-8";
  if (ends_with(path, ".css")) return "text/css; charset=utf-8";
  if (ends_with(path, ".wasm")) return "application/wasm";
  if (ends_with(path, ".json")) return "application/json";
  if (ends_with(path, ".svg")) return "image/svg+xml";
  if (ends_with(path, ".png")) return "image/png";
  return "application/octet-stream";
}

std::string resolve_target(const std::string& root, const std::string& target) {
  std::string p = target.substr(0, target.find_first_of("?#"));  // the query and fragment are the page's
  if (p == "/") p = "/index.html";
  if (p.empty() || p[0] != '/' || p.size() > 512) return "";
  for (char c : p)
    if (!safe_char(c)) return "";  // no %-escapes, backslashes, NULs: nothing to decode, nothing to smuggle
  // Every segment non-empty and not hidden: rules out "..", ".", "//" and dot files.
  for (std::size_t i = 0; i < p.size(); ++i)
    if (p[i] == '/' && (i + 1 == p.size() || p[i + 1] == '/' || p[i + 1] == '.')) return "";
  const std::string full = root + p;
  struct stat st {};
  if (::stat(full.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return "";
  return full;
}

void serve_static(const std::string& root, const std::string& host, int port, const std::function<void(int)>& ready) {
  const int s = ::socket(AF_INET, SOCK_STREAM, 0);
  if (s < 0) throw std::runtime_error(std::string("socket: ") + std::strerror(errno));
  const int one = 1;
  ::setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  if (::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1)
    throw std::invalid_argument("--host: '" + host + "' is not an IPv4 address");
  if (::bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(s, 16) != 0) {
    const std::string why = std::strerror(errno);
    ::close(s);
    throw std::runtime_error("cannot listen on " + host + ":" + std::to_string(port) + ": " + why);
  }
  socklen_t len = sizeof addr;
  ::getsockname(s, reinterpret_cast<sockaddr*>(&addr), &len);
  ready(ntohs(addr.sin_port));
  for (;;) {
    const int c = ::accept(s, nullptr, nullptr);
    if (c < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      throw std::runtime_error(std::string("accept: ") + std::strerror(errno));
    }
    timeval tv{5, 0};  // a client that stalls must not hold the (single) server forever
    ::setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    handle(c, root);
    ::close(c);
  }
}

}  // namespace attn::cli
