from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class SealedAssignment(_message.Message):
    __slots__ = ("header", "nonce", "ciphertext")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    CIPHERTEXT_FIELD_NUMBER: _ClassVar[int]
    header: bytes
    nonce: bytes
    ciphertext: bytes
    def __init__(self, header: _Optional[bytes] = ..., nonce: _Optional[bytes] = ..., ciphertext: _Optional[bytes] = ...) -> None: ...

class SealedAssignmentHeader(_message.Message):
    __slots__ = ("format", "assignment_id", "pool", "task_id", "key_id")
    FORMAT_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_ID_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    format: int
    assignment_id: str
    pool: str
    task_id: int
    key_id: str
    def __init__(self, format: _Optional[int] = ..., assignment_id: _Optional[str] = ..., pool: _Optional[str] = ..., task_id: _Optional[int] = ..., key_id: _Optional[str] = ...) -> None: ...
