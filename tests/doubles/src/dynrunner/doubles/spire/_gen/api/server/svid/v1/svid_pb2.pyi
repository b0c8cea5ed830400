from dynrunner.doubles.spire._gen.api.types import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class BatchNewX509SVIDRequest(_message.Message):
    __slots__ = ("params",)
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    params: _containers.RepeatedCompositeFieldContainer[NewX509SVIDParams]
    def __init__(self, params: _Optional[_Iterable[_Union[NewX509SVIDParams, _Mapping]]] = ...) -> None: ...

class BatchNewX509SVIDResponse(_message.Message):
    __slots__ = ("results",)
    class Result(_message.Message):
        __slots__ = ("status", "svid")
        STATUS_FIELD_NUMBER: _ClassVar[int]
        SVID_FIELD_NUMBER: _ClassVar[int]
        status: _types_pb2.Status
        svid: _types_pb2.X509SVID
        def __init__(self, status: _Optional[_Union[_types_pb2.Status, _Mapping]] = ..., svid: _Optional[_Union[_types_pb2.X509SVID, _Mapping]] = ...) -> None: ...
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[BatchNewX509SVIDResponse.Result]
    def __init__(self, results: _Optional[_Iterable[_Union[BatchNewX509SVIDResponse.Result, _Mapping]]] = ...) -> None: ...

class NewX509SVIDParams(_message.Message):
    __slots__ = ("entry_id", "csr")
    ENTRY_ID_FIELD_NUMBER: _ClassVar[int]
    CSR_FIELD_NUMBER: _ClassVar[int]
    entry_id: str
    csr: bytes
    def __init__(self, entry_id: _Optional[str] = ..., csr: _Optional[bytes] = ...) -> None: ...
