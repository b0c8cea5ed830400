from dynrunner.proto._gen.spire.api.types import selector_pb2 as _selector_pb2
from dynrunner.proto._gen.spire.api.types import spiffeid_pb2 as _spiffeid_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Entry(_message.Message):
    __slots__ = ("id", "spiffe_id", "parent_id", "selectors", "x509_svid_ttl")
    ID_FIELD_NUMBER: _ClassVar[int]
    SPIFFE_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_ID_FIELD_NUMBER: _ClassVar[int]
    SELECTORS_FIELD_NUMBER: _ClassVar[int]
    X509_SVID_TTL_FIELD_NUMBER: _ClassVar[int]
    id: str
    spiffe_id: _spiffeid_pb2.SPIFFEID
    parent_id: _spiffeid_pb2.SPIFFEID
    selectors: _containers.RepeatedCompositeFieldContainer[_selector_pb2.Selector]
    x509_svid_ttl: int
    def __init__(self, id: _Optional[str] = ..., spiffe_id: _Optional[_Union[_spiffeid_pb2.SPIFFEID, _Mapping]] = ..., parent_id: _Optional[_Union[_spiffeid_pb2.SPIFFEID, _Mapping]] = ..., selectors: _Optional[_Iterable[_Union[_selector_pb2.Selector, _Mapping]]] = ..., x509_svid_ttl: _Optional[int] = ...) -> None: ...
