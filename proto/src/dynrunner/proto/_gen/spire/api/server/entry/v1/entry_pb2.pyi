from dynrunner.proto._gen.spire.api.types import entry_pb2 as _entry_pb2
from dynrunner.proto._gen.spire.api.types import spiffeid_pb2 as _spiffeid_pb2
from dynrunner.proto._gen.spire.api.types import status_pb2 as _status_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ListEntriesRequest(_message.Message):
    __slots__ = ("filter", "page_size", "page_token")
    class Filter(_message.Message):
        __slots__ = ("by_spiffe_id", "by_parent_id")
        BY_SPIFFE_ID_FIELD_NUMBER: _ClassVar[int]
        BY_PARENT_ID_FIELD_NUMBER: _ClassVar[int]
        by_spiffe_id: _spiffeid_pb2.SPIFFEID
        by_parent_id: _spiffeid_pb2.SPIFFEID
        def __init__(self, by_spiffe_id: _Optional[_Union[_spiffeid_pb2.SPIFFEID, _Mapping]] = ..., by_parent_id: _Optional[_Union[_spiffeid_pb2.SPIFFEID, _Mapping]] = ...) -> None: ...
    FILTER_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    filter: ListEntriesRequest.Filter
    page_size: int
    page_token: str
    def __init__(self, filter: _Optional[_Union[ListEntriesRequest.Filter, _Mapping]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListEntriesResponse(_message.Message):
    __slots__ = ("entries", "next_page_token")
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[_entry_pb2.Entry]
    next_page_token: str
    def __init__(self, entries: _Optional[_Iterable[_Union[_entry_pb2.Entry, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class BatchCreateEntryRequest(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[_entry_pb2.Entry]
    def __init__(self, entries: _Optional[_Iterable[_Union[_entry_pb2.Entry, _Mapping]]] = ...) -> None: ...

class BatchCreateEntryResponse(_message.Message):
    __slots__ = ("results",)
    class Result(_message.Message):
        __slots__ = ("status", "entry")
        STATUS_FIELD_NUMBER: _ClassVar[int]
        ENTRY_FIELD_NUMBER: _ClassVar[int]
        status: _status_pb2.Status
        entry: _entry_pb2.Entry
        def __init__(self, status: _Optional[_Union[_status_pb2.Status, _Mapping]] = ..., entry: _Optional[_Union[_entry_pb2.Entry, _Mapping]] = ...) -> None: ...
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[BatchCreateEntryResponse.Result]
    def __init__(self, results: _Optional[_Iterable[_Union[BatchCreateEntryResponse.Result, _Mapping]]] = ...) -> None: ...

class BatchDeleteEntryRequest(_message.Message):
    __slots__ = ("ids",)
    IDS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, ids: _Optional[_Iterable[str]] = ...) -> None: ...

class BatchDeleteEntryResponse(_message.Message):
    __slots__ = ("results",)
    class Result(_message.Message):
        __slots__ = ("status", "id")
        STATUS_FIELD_NUMBER: _ClassVar[int]
        ID_FIELD_NUMBER: _ClassVar[int]
        status: _status_pb2.Status
        id: str
        def __init__(self, status: _Optional[_Union[_status_pb2.Status, _Mapping]] = ..., id: _Optional[str] = ...) -> None: ...
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[BatchDeleteEntryResponse.Result]
    def __init__(self, results: _Optional[_Iterable[_Union[BatchDeleteEntryResponse.Result, _Mapping]]] = ...) -> None: ...
