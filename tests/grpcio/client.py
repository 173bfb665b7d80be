"""A stock Python grpcio client for fabric-agent, driven by server reflection only.

It knows no generated code: it lists the services through reflection (v1alpha), builds a
descriptor pool from the server's file descriptors, makes the request messages from it, and
walks one instance through AttachPartition -> ACTIVE -> GetAttachment -> ReleaseInstance ->
RELEASED, after a GetNode.

    client.py --target 127.0.0.1:PORT --instance vm-tcp --pkey 0x0a12
    client.py --target unix:/path/agent.sock --authority localhost --instance vm-unix ...
    client.py --target unix:/path/agent.sock --probe-only     # reflection list only

Over a unix socket, grpc-core sends the socket path as :authority, which the agent's HTTP/2
layer refuses; the one client option `grpc.default_authority` fixes it (README, "Stock gRPC
clients"). Exit 0 when every check passed, 1 otherwise.
"""

import argparse
import sys

import grpc
from google.protobuf import descriptor_pool
from google.protobuf import message_factory
from grpc_reflection.v1alpha import reflection_pb2
from grpc_reflection.v1alpha import reflection_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

SERVICE = "fabric.agent.v1.FabricAgent"
TIMEOUT_S = 30


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def list_services(channel):
    """The service names, through the v1alpha reflection stream."""
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    for response in stub.ServerReflectionInfo(iter([request]), timeout=TIMEOUT_S):
        if response.HasField("error_response"):
            fail(f"reflection error: {response.error_response.error_message}")
        return sorted(s.name for s in response.list_services_response.service)
    fail("reflection returned no response")


class Agent:
    """Unary calls to FabricAgent with messages made from the reflected descriptors."""

    def __init__(self, channel):
        self.channel = channel
        self.pool = descriptor_pool.DescriptorPool(ProtoReflectionDescriptorDatabase(channel))
        self.service = self.pool.FindServiceByName(SERVICE)

    def message(self, type_name, /, **fields):
        cls = message_factory.GetMessageClass(self.pool.FindMessageTypeByName(type_name))
        return cls(**fields)

    def enum_name(self, enum, number):
        return self.pool.FindEnumTypeByName(enum).values_by_number[number].name

    def call(self, method, request):
        desc = self.service.methods_by_name[method]
        reply_cls = message_factory.GetMessageClass(desc.output_type)
        rpc = self.channel.unary_unary(
            f"/{SERVICE}/{method}",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=reply_cls.FromString,
        )
        return rpc(request, timeout=TIMEOUT_S)


def state_of(agent, attachment):
    return agent.enum_name("fabric.agent.v1.AttachmentState", attachment.state)


def walk(agent, args):
    node = agent.call("GetNode", agent.message("fabric.agent.v1.GetNodeRequest"))
    if node.fabric != args.fabric:
        fail(f"GetNode: fabric {node.fabric!r}, expected {args.fabric!r}")
    if not any(p.fabric_port for p in node.ports):
        fail(f"GetNode: no fabric port in {len(node.ports)} ports")
    print(f"GetNode: node {node.node_id}, fabric {node.fabric}, {len(node.ports)} ports, "
          f"SM {node.subnet_manager.backend} reachable={node.subnet_manager.reachable}")

    partition = agent.message(
        "fabric.agent.v1.Partition", id=args.partition, name="grpcio-test",
        workspace="ws", account="acct", fabric=args.fabric, pkey=args.pkey)
    attach = agent.message(
        "fabric.agent.v1.AttachPartitionRequest", partition=partition,
        instance_id=args.instance, wait_ms=20000)
    reply = agent.call("AttachPartition", attach)
    state = state_of(agent, reply.attachment)
    if state != "ATTACHMENT_STATE_ACTIVE":
        fail(f"AttachPartition: {state} ({reply.attachment.reason}), expected ACTIVE")
    print(f"AttachPartition: {args.instance} -> {state}, pkey_value 0x{reply.attachment.pkey_value:04x}")

    got = agent.call("GetAttachment", agent.message(
        "fabric.agent.v1.GetAttachmentRequest", instance_id=args.instance))
    if got.instance_id != args.instance or got.partition.pkey != args.pkey:
        fail(f"GetAttachment: {got.instance_id} pkey {got.partition.pkey:#x}")
    if state_of(agent, got) != "ATTACHMENT_STATE_ACTIVE":
        fail(f"GetAttachment: {state_of(agent, got)}, expected ACTIVE")
    # ACTIVE carries its evidence; the embedded backend has no separate SM hosts to name.
    if not got.HasField("evidence") or got.evidence.sm_generation == 0:
        fail(f"GetAttachment: ACTIVE without its evidence: {got}")
    if list(got.evidence.acknowledged_by):
        fail(f"GetAttachment: the embedded SM names SM hosts: {list(got.evidence.acknowledged_by)}")
    print(f"GetAttachment: {got.instance_id} {state_of(agent, got)}, evidence generation "
          f"{got.evidence.sm_generation} ({len(got.evidence.ports)} ports read)")

    released = agent.call("ReleaseInstance", agent.message(
        "fabric.agent.v1.ReleaseInstanceRequest", instance_id=args.instance, wait_ms=20000))
    state = state_of(agent, released.attachment)
    if state != "ATTACHMENT_STATE_RELEASED":
        fail(f"ReleaseInstance: {state} ({released.attachment.reason}), expected RELEASED")
    if released.attachment.evidence.sm_generation <= got.evidence.sm_generation:
        fail(f"ReleaseInstance: RELEASED without newer evidence: {released.attachment.evidence}")
    print(f"ReleaseInstance: {args.instance} -> {state}, evidence generation "
          f"{released.attachment.evidence.sm_generation}")

    try:
        agent.call("GetAttachment", agent.message(
            "fabric.agent.v1.GetAttachmentRequest", instance_id="no-such-instance"))
        fail("GetAttachment of an unknown instance answered OK")
    except grpc.RpcError as e:
        if e.code() != grpc.StatusCode.NOT_FOUND:
            fail(f"GetAttachment of an unknown instance: {e.code()}, expected NOT_FOUND")
    print("GetAttachment(no-such-instance): NOT_FOUND")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", required=True)
    parser.add_argument("--authority", help="sets the channel option grpc.default_authority")
    parser.add_argument("--probe-only", action="store_true",
                        help="only list services; print the outcome, exit 0 either way")
    parser.add_argument("--instance", default="vm-grpcio")
    parser.add_argument("--partition", default="ibpart_grpcio")
    parser.add_argument("--pkey", type=lambda s: int(s, 0), default=0x0A12)
    parser.add_argument("--fabric", default="fab1")
    args = parser.parse_args()

    options = [("grpc.default_authority", args.authority)] if args.authority else []
    with grpc.insecure_channel(args.target, options=options) as channel:
        if args.probe_only:
            try:
                print(f"reflection without the authority option: ok {list_services(channel)}")
            except grpc.RpcError as e:
                print(f"reflection without the authority option: {e.code().name}: {e.details()}")
            return
        services = list_services(channel)
        print(f"{args.target}: services {services}")
        for wanted in (SERVICE, "grpc.health.v1.Health",
                       "grpc.reflection.v1alpha.ServerReflection"):
            if wanted not in services:
                fail(f"reflection does not list {wanted}")
        walk(Agent(channel), args)
    print(f"{args.target}: ok")


if __name__ == "__main__":
    main()
