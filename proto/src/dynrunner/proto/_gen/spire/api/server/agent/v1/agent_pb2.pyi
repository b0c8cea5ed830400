from google.protobuf import empty_pb2 as _empty_pb2
from dynrunner.proto._gen.spire.api.types import agent_pb2 as _agent_pb2
from dynrunner.proto._gen.spire.api.types import jointoken_pb2 as _jointoken_pb2
from dynrunner.proto._gen.spire.api.types import spiffeid_pb2 as _spiffeid_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ListAgentsRequest(_message.Message):
    __slots__ = ("filter", "page_size", "page_token")
    class Filter(_message.Message):
        __slots__ = ("by_attestation_type",)
        BY_ATTESTATION_TYPE_FIELD_NUMBER: _ClassVar[int]
        by_attestation_type: str
        def __init__(self, by_attestation_type: _Optional[str] = ...) -> None: ...
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
    agents: _containers.RepeatedCompositeFieldContainer[_agent_pb2.Agent]
    next_page_token: str
    def __init__(self, agents: _Optional[_Iterable[_Union[_agent_pb2.Agent, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class DeleteAgentRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: _spiffeid_pb2.SPIFFEID
    def __init__(self, id: _Optional[_Union[_spiffeid_pb2.SPIFFEID, _Mapping]] = ...) -> None: ...

class CreateJoinTokenRequest(_message.Message):
    __slots__ = ("ttl", "token", "agent_id")
    TTL_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    ttl: int
    token: str
    agent_id: _spiffeid_pb2.SPIFFEID
    def __init__(self, ttl: _Optional[int] = ..., token: _Optional[str] = ..., agent_id: _Optional[_Union[_spiffeid_pb2.SPIFFEID, _Mapping]] = ...) -> None: ...
