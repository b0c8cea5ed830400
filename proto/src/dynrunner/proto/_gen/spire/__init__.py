"""The descriptor pool of the SPIRE Server API messages (see proto/generate.py)."""

from google.protobuf import descriptor_pool, empty_pb2

POOL = descriptor_pool.DescriptorPool()
POOL.AddSerializedFile(empty_pb2.DESCRIPTOR.serialized_pb)
