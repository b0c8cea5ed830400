from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SPIFFEID(_message.Message):
    __slots__ = ("trust_domain", "path")
    TRUST_DOMAIN_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    trust_domain: str
    path: str
    def __init__(self, trust_domain: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...

class Selector(_message.Message):
    __slots__ = ("type", "value")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    type: str
    value: str
    def __init__(self, type: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class SelectorMatch(_message.Message):
    __slots__ = ("selectors", "match")
    class MatchBehavior(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        MATCH_EXACT: _ClassVar[SelectorMatch.MatchBehavior]
        MATCH_SUBSET: _ClassVar[SelectorMatch.MatchBehavior]
        MATCH_SUPERSET: _ClassVar[SelectorMatch.MatchBehavior]
        MATCH_ANY: _ClassVar[SelectorMatch.MatchBehavior]
    MATCH_EXACT: SelectorMatch.MatchBehavior
    MATCH_SUBSET: SelectorMatch.MatchBehavior
    MATCH_SUPERSET: SelectorMatch.MatchBehavior
    MATCH_ANY: SelectorMatch.MatchBehavior
    SELECTORS_FIELD_NUMBER: _ClassVar[int]
    MATCH_FIELD_NUMBER: _ClassVar[int]
    selectors: _containers.RepeatedCompositeFieldContainer[Selector]
    match: SelectorMatch.MatchBehavior
    def __init__(self, selectors: _Optional[_Iterable[_Union[Selector, _Mapping]]] = ..., match: _Optional[_Union[SelectorMatch.MatchBehavior, str]] = ...) -> None: ...

class AttestationData(_message.Message):
    __slots__ = ("type", "payload")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    type: str
    payload: bytes
    def __init__(self, type: _Optional[str] = ..., payload: _Optional[bytes] = ...) -> None: ...

class JoinToken(_message.Message):
    __slots__ = ("value", "expires_at")
    VALUE_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    value: str
    expires_at: int
    def __init__(self, value: _Optional[str] = ..., expires_at: _Optional[int] = ...) -> None: ...

class X509SVID(_message.Message):
    __slots__ = ("cert_chain", "id", "expires_at", "hint")
    CERT_CHAIN_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    HINT_FIELD_NUMBER: _ClassVar[int]
    cert_chain: _containers.RepeatedScalarFieldContainer[bytes]
    id: SPIFFEID
    expires_at: int
    hint: str
    def __init__(self, cert_chain: _Optional[_Iterable[bytes]] = ..., id: _Optional[_Union[SPIFFEID, _Mapping]] = ..., expires_at: _Optional[int] = ..., hint: _Optional[str] = ...) -> None: ...

class Agent(_message.Message):
    __slots__ = ("id", "attestation_type", "x509svid_serial_number", "x509svid_expires_at", "selectors", "banned", "can_reattest", "agent_version")
    ID_FIELD_NUMBER: _ClassVar[int]
    ATTESTATION_TYPE_FIELD_NUMBER: _ClassVar[int]
    X509SVID_SERIAL_NUMBER_FIELD_NUMBER: _ClassVar[int]
    X509SVID_EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    SELECTORS_FIELD_NUMBER: _ClassVar[int]
    BANNED_FIELD_NUMBER: _ClassVar[int]
    CAN_REATTEST_FIELD_NUMBER: _ClassVar[int]
    AGENT_VERSION_FIELD_NUMBER: _ClassVar[int]
    id: SPIFFEID
    attestation_type: str
    x509svid_serial_number: str
    x509svid_expires_at: int
    selectors: _containers.RepeatedCompositeFieldContainer[Selector]
    banned: bool
    can_reattest: bool
    agent_version: str
    def __init__(self, id: _Optional[_Union[SPIFFEID, _Mapping]] = ..., attestation_type: _Optional[str] = ..., x509svid_serial_number: _Optional[str] = ..., x509svid_expires_at: _Optional[int] = ..., selectors: _Optional[_Iterable[_Union[Selector, _Mapping]]] = ..., banned: _Optional[bool] = ..., can_reattest: _Optional[bool] = ..., agent_version: _Optional[str] = ...) -> None: ...

class Entry(_message.Message):
    __slots__ = ("id", "spiffe_id", "parent_id", "selectors", "x509_svid_ttl", "federates_with", "admin", "downstream", "expires_at", "dns_names", "revision_number", "store_svid", "jwt_svid_ttl", "hint", "created_at")
    ID_FIELD_NUMBER: _ClassVar[int]
    SPIFFE_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_ID_FIELD_NUMBER: _ClassVar[int]
    SELECTORS_FIELD_NUMBER: _ClassVar[int]
    X509_SVID_TTL_FIELD_NUMBER: _ClassVar[int]
    FEDERATES_WITH_FIELD_NUMBER: _ClassVar[int]
    ADMIN_FIELD_NUMBER: _ClassVar[int]
    DOWNSTREAM_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    DNS_NAMES_FIELD_NUMBER: _ClassVar[int]
    REVISION_NUMBER_FIELD_NUMBER: _ClassVar[int]
    STORE_SVID_FIELD_NUMBER: _ClassVar[int]
    JWT_SVID_TTL_FIELD_NUMBER: _ClassVar[int]
    HINT_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    id: str
    spiffe_id: SPIFFEID
    parent_id: SPIFFEID
    selectors: _containers.RepeatedCompositeFieldContainer[Selector]
    x509_svid_ttl: int
    federates_with: _containers.RepeatedScalarFieldContainer[str]
    admin: bool
    downstream: bool
    expires_at: int
    dns_names: _containers.RepeatedScalarFieldContainer[str]
    revision_number: int
    store_svid: bool
    jwt_svid_ttl: int
    hint: str
    created_at: int
    def __init__(self, id: _Optional[str] = ..., spiffe_id: _Optional[_Union[SPIFFEID, _Mapping]] = ..., parent_id: _Optional[_Union[SPIFFEID, _Mapping]] = ..., selectors: _Optional[_Iterable[_Union[Selector, _Mapping]]] = ..., x509_svid_ttl: _Optional[int] = ..., federates_with: _Optional[_Iterable[str]] = ..., admin: _Optional[bool] = ..., downstream: _Optional[bool] = ..., expires_at: _Optional[int] = ..., dns_names: _Optional[_Iterable[str]] = ..., revision_number: _Optional[int] = ..., store_svid: _Optional[bool] = ..., jwt_svid_ttl: _Optional[int] = ..., hint: _Optional[str] = ..., created_at: _Optional[int] = ...) -> None: ...

class Status(_message.Message):
    __slots__ = ("code", "message")
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    code: int
    message: str
    def __init__(self, code: _Optional[int] = ..., message: _Optional[str] = ...) -> None: ...
