"""An executor plugin that answers Init and never answers Prepare (tests/executor_plugin.rs).

Usage: hanging_executor.py COOKIE_KEY COOKIE_VALUE; grpclib stubs for executor/v1 on PYTHONPATH.
"""
import asyncio
import sys

from pyplugin import HandshakeConfig, Plugin, ServeConfig, serve

from executor.v1 import executor_grpc
from executor.v1 import executor_pb2 as pb


class Hanging(executor_grpc.ExecutorBase):
    async def Init(self, stream):
        await stream.recv_message()
        await stream.send_message(pb.InitResponse(
            name="hanging", version="0.0.1", isolation_levels=["none"],
            placement=pb.PLACEMENT_LOCAL))

    async def Prepare(self, stream):
        await stream.recv_message()
        await asyncio.Event().wait()  # never set

    async def Run(self, stream):
        raise NotImplementedError

    async def Cleanup(self, stream):
        await stream.recv_message()
        await stream.send_message(pb.CleanupResponse())


class ExecutorPlugin(Plugin):
    def servicers(self, broker):
        return [Hanging()]

    def stub(self, broker, channel):
        return executor_grpc.ExecutorStub(channel)


if __name__ == "__main__":
    serve(ServeConfig(
        handshake_config=HandshakeConfig(protocol_version=1, magic_cookie_key=sys.argv[1],
                                         magic_cookie_value=sys.argv[2]),
        plugins={"executor": ExecutorPlugin()},
    ))
