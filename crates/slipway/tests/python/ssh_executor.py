"""An executor plugin with instance placement (tests/executor_plugin.rs): each stage runs over
OpenSSH's `ssh` client on the job's instance, reached with the connection the runner passes in
every call, so the state holds no credentials.

Usage: ssh_executor.py COOKIE_KEY COOKIE_VALUE; grpclib stubs for executor/v1 on PYTHONPATH.
"""
import asyncio
import json
import os
import shutil
import sys
import tempfile
import uuid

from grpclib.const import Status
from grpclib.exceptions import GRPCError
from pyplugin import HandshakeConfig, Plugin, ServeConfig, serve

from executor.v1 import executor_grpc
from executor.v1 import executor_pb2 as pb


def ssh_argv(instance, keyfile, command):
    addr = instance.internal_addr or instance.external_addr
    host, _, port = addr.rpartition(":") if ":" in addr else (addr, "", "")
    port = port or str(instance.protocol_port or 22)
    return ["ssh", "-i", keyfile, "-p", port, "-o", "BatchMode=yes",
            "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
            "-o", "LogLevel=ERROR", f"{instance.username}@{host}", command]


class Ssh(executor_grpc.ExecutorBase):
    def _key(self, instance):
        """The instance's key in a private file of this process (never in the state)."""
        if not instance.key:
            raise GRPCError(Status.FAILED_PRECONDITION, "the instance came without a key")
        d = tempfile.mkdtemp(prefix="ssh-executor-")
        path = os.path.join(d, "key")
        with open(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
            f.write(instance.key)
        return d, path

    async def _ssh(self, instance, command, stdin=b"", stream=None):
        d, key = self._key(instance)
        try:
            proc = await asyncio.create_subprocess_exec(
                *ssh_argv(instance, key, command), stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                start_new_session=True)
            try:
                if stream is None:
                    out, err = await proc.communicate(stdin)
                    return proc.returncode, out, err
                proc.stdin.write(stdin)
                proc.stdin.close()
                lock = asyncio.Lock()  # grpclib takes one send at a time

                async def pump(reader, field):
                    while chunk := await reader.read(65536):
                        async with lock:
                            await stream(pb.RunOutput(**{field: chunk}))
                await asyncio.gather(pump(proc.stdout, "stdout"), pump(proc.stderr, "stderr"))
                return await proc.wait(), b"", b""
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
        finally:
            shutil.rmtree(d, ignore_errors=True)

    async def Init(self, stream):
        await stream.recv_message()
        await stream.send_message(pb.InitResponse(
            name="ssh", version="0.0.1", isolation_levels=["none"],
            placement=pb.PLACEMENT_INSTANCE))

    async def Prepare(self, stream):
        req = await stream.recv_message()
        if not req.HasField("instance"):
            raise GRPCError(Status.INVALID_ARGUMENT, "no instance: this plugin runs jobs on one")
        job_id = json.loads(req.job).get("id", 0)
        remote = f"/tmp/ssh-executor/job-{job_id}-{uuid.uuid4().hex[:8]}"
        code, _, err = await self._ssh(req.instance, f"mkdir -p {remote}/scripts")
        if code != 0:
            raise GRPCError(Status.INTERNAL, f"preparing {remote}: {err.decode(errors='replace')}")
        await stream.send_message(pb.PrepareResponse(
            state=remote.encode(), builds_dir=f"{remote}/builds",
            messages=[f"Using ssh executor plugin on instance {req.instance.id} in {remote}"]))

    async def Run(self, stream):
        req = await stream.recv_message()
        remote = req.state.decode()
        script = f"{remote}/scripts/{req.stage}.sh"
        code, _, err = await self._ssh(req.instance, f"cat > {script}", req.script)
        if code != 0:
            raise GRPCError(Status.INTERNAL, f"uploading the script: {err.decode(errors='replace')}")
        code, _, _ = await self._ssh(req.instance, f"bash --noprofile --norc {script}", req.stdin,
                                     stream=stream.send_message)
        if code == 255:  # ssh's own failure
            await stream.send_message(pb.RunOutput(exit=pb.Exit(
                code=code, failure=pb.FAILURE_SYSTEM, message="ssh to the instance failed")))
        else:
            await stream.send_message(pb.RunOutput(exit=pb.Exit(code=code)))

    async def Cleanup(self, stream):
        req = await stream.recv_message()
        remote = req.state.decode()
        if remote.startswith("/tmp/ssh-executor/job-"):
            await self._ssh(req.instance, f"rm -rf {remote}")
        await stream.send_message(pb.CleanupResponse())


class ExecutorPlugin(Plugin):
    def servicers(self, broker):
        return [Ssh()]

    def stub(self, broker, channel):
        return executor_grpc.ExecutorStub(channel)


if __name__ == "__main__":
    serve(ServeConfig(
        handshake_config=HandshakeConfig(protocol_version=1, magic_cookie_key=sys.argv[1],
                                         magic_cookie_value=sys.argv[2]),
        plugins={"executor": ExecutorPlugin()},
    ))
