from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor

class SPIFFEID(_message.Message):
    __slots__ = ("trust_domain", "path")
    TRUST_DOMAIN_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    trust_domain: str
    path: str
    def __init__(self, trust_domain: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...
