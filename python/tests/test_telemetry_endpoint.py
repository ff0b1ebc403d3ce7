"""The metrics endpoint against the clients it meets on a shared cluster: slow and idle clients on
loopback, bad options, and a real Prometheus (Debian's) scraping over TLS with basic auth next to
scrapes it must refuse (no password, a wrong one, plain HTTP, a client outside the allow list)."""
import ctypes
import ctypes.util
import json
import shutil
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

import gpucloud as gc
from gpucloud import telemetry
from ports import free_port

PASSWORD = "s3cret pass"


def bcrypt(password, cost=5):
    """A bcrypt hash made by libcrypt (libxcrypt), as `htpasswd -nbB` would."""
    lib = ctypes.CDLL(ctypes.util.find_library("crypt") or "libcrypt.so.1")
    lib.crypt.restype = ctypes.c_char_p
    lib.crypt.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    salt = f"$2b${cost:02d}$" + "abcdefghijklmnopqrstuu"
    out = lib.crypt(password.encode(), salt.encode())
    assert out and out.startswith(b"$2b$"), out
    return out.decode()


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    openssl = shutil.which("openssl")
    assert openssl, "openssl is not installed (Debian package openssl; scripts/setup.sh installs it)"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(d / "key.pem"),
                    "-out", str(d / "cert.pem"), "-days", "2", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"], check=True, capture_output=True)
    return str(d / "cert.pem"), str(d / "key.pem")


def secured(certificate, **extra):
    cert, key = certificate
    options = dict(port=0, address="127.0.0.1", tls_cert_file=cert, tls_key_file=key,
                   basic_auth_users={"prom": bcrypt(PASSWORD)})
    options.update(extra)
    exporter = telemetry.Exporter(**options)
    exporter.steps.record(0.5, samples=10)
    return exporter


def fetch(url, cafile=None, user=None, password=None):
    """(status, body) of a GET; status 0 when the connection itself fails."""
    request = urllib.request.Request(url)
    if user is not None:
        import base64

        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    context = ssl.create_default_context(cafile=cafile) if cafile else None
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""
    except (urllib.error.URLError, ConnectionError, ssl.SSLError, OSError):
        return 0, ""


# ---- TLS, basic auth and the allow list, from a Python client ----------------------------------

def test_https_with_basic_auth_serves_only_the_right_password(certificate):
    exporter = secured(certificate)
    url = f"https://127.0.0.1:{exporter.port}/metrics"
    status, body = fetch(url, certificate[0], "prom", PASSWORD)
    assert status == 200 and "gpucloud_steps_total" in body
    assert fetch(url, certificate[0])[0] == 401
    assert fetch(url, certificate[0], "prom", "wrong")[0] == 401
    assert fetch(url, certificate[0], "someone", PASSWORD)[0] == 401
    assert fetch(f"http://127.0.0.1:{exporter.port}/metrics", None, "prom", PASSWORD)[0] != 200  # no plain HTTP


def test_the_allow_list_refuses_clients_outside_it(certificate):
    refused = secured(certificate, allow=["10.0.0.0/8"])
    assert fetch(f"https://127.0.0.1:{refused.port}/metrics", certificate[0], "prom", PASSWORD)[0] != 200
    allowed = secured(certificate, allow=["10.0.0.0/8", "127.0.0.1/32"])
    assert fetch(f"https://127.0.0.1:{allowed.port}/metrics", certificate[0], "prom", PASSWORD)[0] == 200


@pytest.mark.parametrize("options, word", [
    (dict(port=2**32 + 9100), "port"), (dict(port=-2), "port"), (dict(address="999.1.1.1"), "address"),
    (dict(address="localhost"), "address"), (dict(threads=0), "threads"), (dict(request_timeout=0), "request_timeout"),
    (dict(labels={"le": "x"}), "reserved"), (dict(labels={"quantile": "x"}), "reserved"),
    (dict(labels={"bad-name": "x"}), "label name"), (dict(basic_auth_users={"prom": "plain"}), "bcrypt"),
    (dict(allow=["10.0.0.0/40"]), "CIDR"), (dict(tls_cert_file="/etc/hostname"), "tls_"),
])
def test_bad_options_are_typed_errors_naming_the_option(options, word):
    with pytest.raises(gc.InvalidArgument, match=word):
        telemetry.Exporter(**options)


def test_option_types_are_checked():
    with pytest.raises(TypeError, match="allow"):
        telemetry.Exporter(port=-1, allow="127.0.0.1")
    with pytest.raises(TypeError, match="tls_cert_file"):
        telemetry.Exporter(port=-1, tls_cert_file=3, tls_key_file="k")


# ---- slow clients -----------------------------------------------------------------------------------

def test_idle_half_sent_requests_do_not_stall_a_scrape():
    exporter = telemetry.Exporter(port=0, address="127.0.0.1", request_timeout=120)
    exporter.steps.record(0.5, samples=10)
    idle = []
    for _ in range(4):
        s = socket.create_connection(("127.0.0.1", exporter.port))
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x")  # and nothing more
        idle.append(s)
    status, body = fetch(f"http://127.0.0.1:{exporter.port}/metrics")
    assert status == 200 and "gpucloud_steps_total" in body
    for s in idle:  # still waiting: the scrape was served beside them, not after their timeout
        s.setblocking(False)
        with pytest.raises(BlockingIOError):
            s.recv(1, socket.MSG_PEEK)
        s.close()


# ---- a real Prometheus ------------------------------------------------------------------------------

def test_a_real_prometheus_scrapes_over_tls_with_basic_auth_and_is_refused_without(tmp_path, certificate):
    prometheus = shutil.which("prometheus")
    assert prometheus, "the prometheus server is not installed (Debian package prometheus; scripts/setup.sh does)"
    exporter = secured(certificate)
    target = f'["127.0.0.1:{exporter.port}"]'
    ca = certificate[0]
    (tmp_path / "prometheus.yml").write_text(f"""global:
  scrape_interval: 1s
scrape_configs:
  - job_name: authorized
    scheme: https
    tls_config: {{ca_file: "{ca}"}}
    basic_auth: {{username: prom, password: "{PASSWORD}"}}
    static_configs: [{{targets: {target}}}]
  - job_name: no_password
    scheme: https
    tls_config: {{ca_file: "{ca}"}}
    static_configs: [{{targets: {target}}}]
  - job_name: wrong_password
    scheme: https
    tls_config: {{ca_file: "{ca}"}}
    basic_auth: {{username: prom, password: wrong}}
    static_configs: [{{targets: {target}}}]
  - job_name: plain_http
    static_configs: [{{targets: {target}}}]
""")
    port = free_port()
    server = subprocess.Popen([prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
                               f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        up = {}
        deadline = time.monotonic() + 120  # a bound for a loaded machine; normally about 3 s
        while time.monotonic() < deadline and len(up) < 4:
            time.sleep(0.5)
            url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": "up"})
            try:
                with urllib.request.urlopen(url, timeout=5) as r:
                    result = json.load(r)["data"]["result"]
            except (urllib.error.URLError, ConnectionError, OSError):
                continue
            up = {s["metric"]["job"]: s["value"][1] for s in result}
        assert up == {"authorized": "1", "no_password": "0", "wrong_password": "0", "plain_http": "0"}, up
        url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": "gpucloud_steps_total"})
        with urllib.request.urlopen(url, timeout=5) as r:
            series = json.load(r)["data"]["result"]
        assert [s["metric"]["job"] for s in series] == ["authorized"] and series[0]["value"][1] == "1", series
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
