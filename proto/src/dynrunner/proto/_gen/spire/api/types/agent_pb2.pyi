from dynrunner.proto._gen.spire.api.types import selector_pb2 as _selector_pb2
from dynrunner.proto._gen.spire.api.types import spiffeid_pb2 as _spiffeid_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Agent(_message.Message):
    __slots__ = ("id", "attestation_type", "selectors", "banned")
    ID_FIELD_NUMBER: _ClassVar[int]
    ATTESTATION_TYPE_FIELD_NUMBER: _ClassVar[int]
    SELECTORS_FIELD_NUMBER: _ClassVar[int]
    BANNED_FIELD_NUMBER: _ClassVar[int]
    id: _spiffeid_pb2.SPIFFEID
    attestation_type: str
    selectors: _containers.RepeatedCompositeFieldContainer[_selector_pb2.Selector]
    banned: bool
    def __init__(self, id: _Optional[_Union[_spiffeid_pb2.SPIFFEID, _Mapping]] = ..., attestation_type: _Optional[str] = ..., selectors: _Optional[_Iterable[_Union[_selector_pb2.Selector, _Mapping]]] = ..., banned: _Optional[bool] = ...) -> None: ...
