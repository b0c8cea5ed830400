from google.protobuf import empty_pb2 as _empty_pb2
from dynrunner.doubles.spire._gen.api.types import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ListAgentsRequest(_message.Message):
    __slots__ = ("filter", "page_size", "page_token")
    class Filter(_message.Message):
        __slots__ = ("by_attestation_type", "by_selector_match")
        BY_ATTESTATION_TYPE_FIELD_NUMBER: _ClassVar[int]
        BY_SELECTOR_MATCH_FIELD_NUMBER: _ClassVar[int]
        by_attestation_type: str
        by_selector_match: _types_pb2.SelectorMatch
        def __init__(self, by_attestation_type: _Optional[str] = ..., by_selector_match: _Optional[_Union[_types_pb2.SelectorMatch, _Mapping]] = ...) -> None: ...
    FILTER_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    filter: ListAgentsRequest.Filter
    page_size: int
    page_token: str
    def __init__(self, filter: _Optional[_Union[ListAgentsRequest.Filter, _Mapping]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListAgentsResponse(_message.Message):
    __slots__ = ("agents", "next_page_token")
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    agents: _containers.RepeatedCompositeFieldContainer[_types_pb2.Agent]
    next_page_token: str
    def __init__(self, agents: _Optional[_Iterable[_Union[_types_pb2.Agent, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class GetAgentRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: _types_pb2.SPIFFEID
    def __init__(self, id: _Optional[_Union[_types_pb2.SPIFFEID, _Mapping]] = ...) -> None: ...

class DeleteAgentRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: _types_pb2.SPIFFEID
    def __init__(self, id: _Optional[_Union[_types_pb2.SPIFFEID, _Mapping]] = ...) -> None: ...

class BanAgentRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: _types_pb2.SPIFFEID
    def __init__(self, id: _Optional[_Union[_types_pb2.SPIFFEID, _Mapping]] = ...) -> None: ...

class AttestAgentRequest(_message.Message):
    __slots__ = ("params", "challenge_response")
    class Params(_message.Message):
        __slots__ = ("data", "params")
        DATA_FIELD_NUMBER: _ClassVar[int]
        PARAMS_FIELD_NUMBER: _ClassVar[int]
        data: _types_pb2.AttestationData
        params: AgentX509SVIDParams
        def __init__(self, data: _Optional[_Union[_types_pb2.AttestationData, _Mapping]] = ..., params: _Optional[_Union[AgentX509SVIDParams, _Mapping]] = ...) -> None: ...
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    CHALLENGE_RESPONSE_FIELD_NUMBER: _ClassVar[int]
    params: AttestAgentRequest.Params
    challenge_response: bytes
    def __init__(self, params: _Optional[_Union[AttestAgentRequest.Params, _Mapping]] = ..., challenge_response: _Optional[bytes] = ...) -> None: ...

class AttestAgentResponse(_message.Message):
    __slots__ = ("result", "challenge")
    class Result(_message.Message):
        __slots__ = ("svid", "reattestable")
        SVID_FIELD_NUMBER: _ClassVar[int]
        REATTESTABLE_FIELD_NUMBER: _ClassVar[int]
        svid: _types_pb2.X509SVID
        reattestable: bool
        def __init__(self, svid: _Optional[_Union[_types_pb2.X509SVID, _Mapping]] = ..., reattestable: _Optional[bool] = ...) -> None: ...
    RESULT_FIELD_NUMBER: _ClassVar[int]
    CHALLENGE_FIELD_NUMBER: _ClassVar[int]
    result: AttestAgentResponse.Result
    challenge: bytes
    def __init__(self, result: _Optional[_Union[AttestAgentResponse.Result, _Mapping]] = ..., challenge: _Optional[bytes] = ...) -> None: ...

class CreateJoinTokenRequest(_message.Message):
    __slots__ = ("ttl", "token", "agent_id")
    TTL_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    ttl: int
    token: str
    agent_id: _types_pb2.SPIFFEID
    def __init__(self, ttl: _Optional[int] = ..., token: _Optional[str] = ..., agent_id: _Optional[_Union[_types_pb2.SPIFFEID, _Mapping]] = ...) -> None: ...

class AgentX509SVIDParams(_message.Message):
    __slots__ = ("csr",)
    CSR_FIELD_NUMBER: _ClassVar[int]
    csr: bytes
    def __init__(self, csr: _Optional[bytes] = ...) -> None: ...
