"""mTLS to a SPIRE server the way SPIRE's own clients do it: the server is verified by its
SPIFFE ID (`spiffe://<trust domain>/spire/server`), not by a host name.

A real SPIRE server's X509-SVID carries only that URI SAN — no DNS name, no IP — so gRPC's
TLS (which always checks the host name, and in Python takes no custom verifier) refuses every
connection to it ("Hostname Verification Check failed"). The controller's gRPC channel
therefore speaks plain HTTP/2 to a unix socket of its own (in a directory only this process's
user can enter), and each connection there is carried over a TLS connection that Python's
`ssl` makes: the chain verified against the trust bundle, the server's SPIFFE ID checked, the
controller's admin X509-SVID presented, ALPN `h2` (SPIRE's gRPC server requires it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import ssl
import tempfile
from pathlib import Path

from cryptography import x509

log = logging.getLogger(__name__)

__all__ = ["SpiffeTlsBridge", "server_spiffe_id"]

_CHUNK = 64 * 1024


def server_spiffe_id(trust_domain: str) -> str:
    return f"spiffe://{trust_domain}/spire/server"


def _uri_sans(der: bytes) -> list[str]:
    cert = x509.load_der_x509_certificate(der)
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return names.get_values_for_type(x509.UniformResourceIdentifier)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, ssl.SSLError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


class SpiffeTlsBridge:
    """A local unix socket (`target` for `grpc.aio.insecure_channel`) whose connections go to
    `address` over mTLS with the SPIFFE ID check; `start` reads the credential files once."""

    def __init__(
        self,
        address: str,
        *,
        bundle_file: Path,
        server_id: str,
        cert_file: Path | None = None,
        key_file: Path | None = None,
        sni: str = "",
    ) -> None:
        """Without `cert_file` the bridge presents no certificate (as an agent that attests)."""
        host, _, port = address.rpartition(":")
        self._host, self._port = host.strip("[]"), int(port)
        self._files = (cert_file, key_file, bundle_file)
        self._server_id = server_id
        self._sni = sni or self._host
        self._dir = Path(tempfile.mkdtemp(prefix="dynrunner-spire-"))  # mode 0700
        self.socket_path = self._dir / "api.sock"
        self._server: asyncio.Server | None = None
        self._context: ssl.SSLContext | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def target(self) -> str:
        return f"unix:{self.socket_path}"

    def _ssl_context(self) -> ssl.SSLContext:
        cert, key, bundle = self._files
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(bundle))
        context.check_hostname = False  # the SPIFFE ID is checked instead (below)
        context.verify_mode = ssl.CERT_REQUIRED
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        if cert is not None:
            context.load_cert_chain(str(cert), str(key) if key is not None else None)
        context.set_alpn_protocols(["h2"])
        return context

    async def start(self) -> None:
        """Raises OSError/ssl.SSLError when the files cannot be read or used."""
        self._context = self._ssl_context()
        self._server = await asyncio.start_unix_server(self._accept, path=str(self.socket_path))

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            upstream = await self._connect()
        except (OSError, ssl.SSLError, ValueError) as err:
            log.warning("SPIRE server %s:%s: %s", self._host, self._port, err)
            writer.close()
            self._tasks.discard(task)
            return
        up_reader, up_writer = upstream
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        except asyncio.CancelledError:
            pass  # the bridge closes: this connection ends with it (the handler's result is unused)
        finally:
            for end in (writer, up_writer):
                end.close()
            self._tasks.discard(task)

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(self._host, self._port, ssl=self._context, server_hostname=self._sni), 30
        )
        tls = writer.get_extra_info("ssl_object")
        der = tls.getpeercert(binary_form=True) if tls is not None else None
        ids = _uri_sans(der) if der else []
        if self._server_id not in ids:
            writer.close()
            raise ValueError(f"the server presented {ids or 'no SPIFFE ID'}, not {self._server_id}")
        return reader, writer

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
        self._server = None
        shutil.rmtree(self._dir, ignore_errors=True)
