"""One SPIRE agent's Workload API: gRPC service `SpiffeWorkloadAPI` on a unix socket.

As SPIRE's handler does (pkg/agent/endpoints/workload/handler.go, middleware.go):
- every call must carry the metadata `workload.spiffe.io: true`, else INVALID_ARGUMENT
  "security header missing from request";
- the caller is identified by the unix socket's peer credentials (SO_PEERCRED) and attested
  into selectors; with no matching entry the stream ends with PERMISSION_DENIED
  "no identity issued" (also later, if its entries go away);
- FetchX509SVID streams every matching SVID with the bundle, and again whenever the
  entries change or an SVID reaches half its lifetime (rotation);
- FetchJWTSVID signs a JWT-SVID (jwt.py) for every matching entry, or only the one named by
  `spiffe_id`, for the requested audiences (none → INVALID_ARGUMENT "audience must be
  specified"); FetchJWTBundles streams the trust domain's JWKS; ValidateJWTSVID checks a token
  against it. An agent built without a JWT authority answers UNIMPLEMENTED to all three.

grpc-python does not expose a unix peer's credentials, so the socket is served by a small
relay: it reads SO_PEERCRED of each accepted connection and forwards the bytes to the gRPC
server on a loopback port, remembering which loopback client port carries which caller.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import os
import socket
import struct
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc

from dynrunner.doubles.spire._gen import workload_pb2 as pb
from dynrunner.doubles.spire.attestor import Caller
from dynrunner.doubles.spire.ca import Svid, TrustDomainCA
from dynrunner.doubles.spire.entries import Agent, Entry, EntryStore, Selector
from dynrunner.doubles.spire.jwt import JwtAuthority, JwtValidationError

SERVICE = "SpiffeWorkloadAPI"
HEADER = "workload.spiffe.io"


class SvidCache:
    """The agent's SVID per entry, renewed at half its lifetime."""

    def __init__(self, ca: TrustDomainCA) -> None:
        self._ca = ca
        self._svids: dict[str, tuple[Entry, Svid]] = {}

    def svid(self, entry: Entry) -> Svid:
        cached = self._svids.get(entry.id)
        now = dt.datetime.now(dt.UTC)
        if cached is None or cached[0] != entry or now >= cached[1].rotate_at():
            cached = (entry, self._ca.sign(entry.spiffe_id, entry.x509_svid_ttl, entry.dns_names))
            self._svids[entry.id] = cached
        return cached[1]


class WorkloadApi:
    def __init__(
        self,
        agent: Agent,
        entries: EntryStore,
        ca: TrustDomainCA,
        socket_path: Path,
        attest: Callable[[Caller], set[Selector]],
        federated: dict[str, bytes] | None = None,
        jwt_authority: JwtAuthority | None = None,
    ) -> None:
        self.agent = agent
        self.jwt = jwt_authority
        self.jwt_svids_issued = 0
        self.socket_path = socket_path
        self._entries = entries
        self._ca = ca
        self._attest = attest
        self._federated = dict(federated or {})
        self._svids = SvidCache(ca)
        self._callers: dict[int, Caller] = {}
        self._server: grpc.aio.Server | None = None
        self._relay: asyncio.Server | None = None
        self._port = 0
        self._relays: set[asyncio.Task[Any]] = set()

    async def start(self) -> None:
        self._server = grpc.aio.server()
        handlers = {
            "FetchX509SVID": grpc.unary_stream_rpc_method_handler(
                self._fetch_x509_svid,
                request_deserializer=pb.X509SVIDRequest.FromString,
                response_serializer=pb.X509SVIDResponse.SerializeToString,
            ),
            "FetchX509Bundles": grpc.unary_stream_rpc_method_handler(
                self._fetch_x509_bundles,
                request_deserializer=pb.X509BundlesRequest.FromString,
                response_serializer=pb.X509BundlesResponse.SerializeToString,
            ),
            "FetchJWTSVID": grpc.unary_unary_rpc_method_handler(
                self._fetch_jwt_svid if self.jwt else self._unimplemented,
                request_deserializer=pb.JWTSVIDRequest.FromString,
                response_serializer=pb.JWTSVIDResponse.SerializeToString,
            ),
            "FetchJWTBundles": grpc.unary_stream_rpc_method_handler(
                self._fetch_jwt_bundles if self.jwt else self._unimplemented_stream,
                request_deserializer=pb.JWTBundlesRequest.FromString,
                response_serializer=pb.JWTBundlesResponse.SerializeToString,
            ),
            "ValidateJWTSVID": grpc.unary_unary_rpc_method_handler(
                self._validate_jwt_svid if self.jwt else self._unimplemented,
                request_deserializer=pb.ValidateJWTSVIDRequest.FromString,
                response_serializer=pb.ValidateJWTSVIDResponse.SerializeToString,
            ),
        }
        self._server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        self._port = self._server.add_insecure_port("127.0.0.1:0")
        await self._server.start()
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        self._relay = await asyncio.start_unix_server(self._accept, path=str(self.socket_path))
        os.chmod(self.socket_path, 0o777)

    async def stop(self) -> None:
        if self._relay is not None:
            self._relay.close()
        for task in list(self._relays):
            task.cancel()
        await asyncio.gather(*self._relays, return_exceptions=True)
        if self._server is not None:
            await self._server.stop(0)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    # --- the relay that learns the caller ----------------------------------------------
    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._relays.add(task)
        sock = writer.get_extra_info("socket")
        pid, uid, gid = struct.unpack(
            "3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        )
        port = 0
        up_writer: asyncio.StreamWriter | None = None
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self._port)
            port = up_writer.get_extra_info("sockname")[1]
            self._callers[port] = Caller(pid, uid, gid)
            await asyncio.gather(_pump(reader, up_writer), _pump(up_reader, writer))
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            self._callers.pop(port, None)
            for stream in (writer, up_writer):
                if stream is not None:
                    stream.close()
                    with contextlib.suppress(OSError, asyncio.CancelledError):
                        await stream.wait_closed()
            self._relays.discard(task)

    def _caller(self, context: grpc.aio.ServicerContext[Any, Any]) -> Caller | None:
        peer = context.peer()  # "ipv4:127.0.0.1:54321"
        try:
            return self._callers.get(int(peer.rsplit(":", 1)[1]))
        except (ValueError, IndexError):
            return None

    async def _check(self, context: grpc.aio.ServicerContext[Any, Any]) -> set[Selector]:
        values = [value for key, value in context.invocation_metadata() or () if key == HEADER]
        if values != ["true"]:  # exactly one value, "true" (SPIRE's verifySecurityHeader)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "security header missing from request")
        caller = self._caller(context)
        if caller is None:
            await context.abort(
                grpc.StatusCode.INTERNAL, "Is this a supported system? Please report this bug: no caller PID"
            )
        assert caller is not None
        return self._attest(caller)

    # --- handlers -------------------------------------------------------------------------
    async def _fetch_x509_svid(
        self, _: pb.X509SVIDRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.X509SVIDResponse]:
        selectors = await self._check(context)
        last: tuple[tuple[str, bytes], ...] | None = None
        while True:
            version = self._entries.version
            matched = self._entries.match(self.agent, selectors)
            if not matched:
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, "no identity issued")
            svids = [(entry, self._svids.svid(entry)) for entry in matched]
            sent = tuple((svid.spiffe_id, svid.chain_der) for _, svid in svids)
            if sent != last:
                last = sent
                yield pb.X509SVIDResponse(
                    svids=[
                        pb.X509SVID(
                            spiffe_id=s.spiffe_id,
                            x509_svid=s.chain_der,
                            x509_svid_key=s.key_der,
                            bundle=self._ca.bundle_der,
                            hint=e.hint,
                        )
                        for e, s in svids
                    ],
                    federated_bundles=self._federated,
                )
            rotate = min(svid.rotate_at() for _, svid in svids)
            wait = max((rotate - dt.datetime.now(dt.UTC)).total_seconds(), 0.05)
            await self._entries.wait_changed(version, min(wait, 3600.0))

    async def _fetch_x509_bundles(
        self, _: pb.X509BundlesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.X509BundlesResponse]:
        selectors = await self._check(context)
        if not self._entries.match(self.agent, selectors):
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "no identity issued")
        yield pb.X509BundlesResponse(
            bundles={f"spiffe://{self._ca.trust_domain}": self._ca.bundle_der, **self._federated}
        )
        while True:
            version = self._entries.version
            await self._entries.wait_changed(version, 3600.0)
            if not self._entries.match(self.agent, selectors):
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, "no identity issued")

    async def _fetch_jwt_svid(
        self, request: pb.JWTSVIDRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.JWTSVIDResponse:
        assert self.jwt is not None
        if not request.audience:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "audience must be specified")
        selectors = await self._check(context)
        matched = self._entries.match(self.agent, selectors)
        if request.spiffe_id:
            matched = [entry for entry in matched if entry.spiffe_id == request.spiffe_id]
        if not matched:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "no identity issued")
        self.jwt_svids_issued += len(matched)
        return pb.JWTSVIDResponse(
            svids=[
                pb.JWTSVID(spiffe_id=e.spiffe_id, svid=self.jwt.sign(e.spiffe_id, list(request.audience)), hint=e.hint)
                for e in matched
            ]
        )

    async def _fetch_jwt_bundles(
        self, _: pb.JWTBundlesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.JWTBundlesResponse]:
        assert self.jwt is not None
        selectors = await self._check(context)
        if not self._entries.match(self.agent, selectors):
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "no identity issued")
        yield pb.JWTBundlesResponse(bundles={f"spiffe://{self.jwt.trust_domain}": self.jwt.jwks_bytes()})
        while True:
            version = self._entries.version
            await self._entries.wait_changed(version, 3600.0)
            if not self._entries.match(self.agent, selectors):
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, "no identity issued")

    async def _validate_jwt_svid(
        self, request: pb.ValidateJWTSVIDRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ValidateJWTSVIDResponse:
        assert self.jwt is not None
        if not request.audience:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "audience must be specified")
        if not request.svid:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "svid must be specified")
        await self._check(context)
        try:
            claims = self.jwt.validate(request.svid, request.audience)
        except JwtValidationError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
            raise
        response = pb.ValidateJWTSVIDResponse(spiffe_id=str(claims["sub"]))
        response.claims.update(claims)
        return response

    async def _unimplemented(self, _: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "this agent double has no JWT authority")

    async def _unimplemented_stream(self, _: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[Any]:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "this agent double has no JWT authority")
        yield None


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            if writer.can_write_eof():
                writer.write_eof()
