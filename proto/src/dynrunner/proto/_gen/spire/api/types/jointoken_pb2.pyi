from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class JoinToken(_message.Message):
    __slots__ = ("value", "expires_at")
    VALUE_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    value: str
    expires_at: int
    def __init__(self, value: _Optional[str] = ..., expires_at: _Optional[int] = ...) -> None: ...
