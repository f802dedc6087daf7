"""gRPC server reflection under both names clients ask for: ``grpc.reflection.v1`` (what
current grpcurl, Postman and grpcui try first) and ``grpc.reflection.v1alpha``.

grpcio-reflection ships only v1alpha. The v1 protocol is the same messages under the
new package name, so one servicer answers both: the v1 service is registered with the
v1alpha message classes (the bytes on the wire are identical), and a v1 copy of the
reflection file descriptor, the package renamed, is added to the descriptor pool so
reflection can describe the v1 service itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc

__all__ = ["V1ALPHA_SERVICE", "V1_SERVICE", "enable"]

V1ALPHA_SERVICE = reflection.SERVICE_NAME
V1_SERVICE = "grpc.reflection.v1.ServerReflection"
_OLD, _NEW = "grpc.reflection.v1alpha", "grpc.reflection.v1"


def _add_v1_descriptor(pool: descriptor_pool.DescriptorPool) -> None:
    """Add ``grpc/reflection/v1/reflection.proto`` to ``pool`` (once)."""
    name = "grpc/reflection/v1/reflection.proto"
    try:
        pool.FindFileByName(name)
        return
    except KeyError:
        pass
    proto = descriptor_pb2.FileDescriptorProto.FromString(reflection_pb2.DESCRIPTOR.serialized_pb)
    proto.name, proto.package = name, _NEW
    proto.options.Clear()
    for message in proto.message_type:
        for field in message.field:
            if field.HasField("type_name"):  # message fields only: assigning sets it
                field.type_name = field.type_name.replace(f".{_OLD}.", f".{_NEW}.")
    for service in proto.service:
        for method in service.method:
            method.input_type = method.input_type.replace(f".{_OLD}.", f".{_NEW}.")
            method.output_type = method.output_type.replace(f".{_OLD}.", f".{_NEW}.")
    pool.Add(proto)


def enable(service_names: Sequence[str], server: grpc.aio.Server) -> None:
    """Serve reflection for ``service_names`` (and both reflection services) on ``server``."""
    pool = descriptor_pool.Default()
    _add_v1_descriptor(pool)
    names = (*service_names, V1_SERVICE, V1ALPHA_SERVICE)
    servicer = reflection.aio.ReflectionServicer(names, pool=pool)
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)  # v1alpha
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(V1_SERVICE, {"ServerReflectionInfo": handler}),)
    )
