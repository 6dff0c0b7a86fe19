"""A real container registry for the tests: Debian's ``docker-registry`` (the
distribution registry) on 127.0.0.1, with htpasswd basic auth (bcrypt) and TLS from a
CA this module makes. The local engine trusts the CA through
``/etc/docker/certs.d/127.0.0.1:<port>/ca.crt`` while the registry runs (removed on
stop). Pushes go through ``docker --config <own dir>``, so nobody's docker login is
touched.
"""

from __future__ import annotations

import datetime
import ipaddress
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path

import bcrypt
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from .services import free_port, image_tag, stop_process, wait_port

CERTS_D = Path("/etc/docker/certs.d")


def _cert(subject: str, key, issuer_name=None, issuer_key=None, ca: bool = False):
    now = datetime.datetime.now(datetime.UTC)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    b = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer_name or name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if not ca:
        b = b.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
    return b.sign(issuer_key or key, hashes.SHA256())


def _pem(obj) -> bytes:
    if isinstance(obj, x509.Certificate):
        return obj.public_bytes(serialization.Encoding.PEM)
    return obj.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,
        serialization.NoEncryption(),
    )


class Registry:
    """One ``docker-registry`` process with its own storage, users and certificate."""

    def __init__(self, username: str = "pusher", password: str | None = None):
        self.dir = Path(tempfile.mkdtemp(prefix="bai-registry-"))
        self.port = free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.url = f"https://{self.host}"
        self.username = username
        self.password = password or secrets.token_urlsafe(12)
        self.proc: subprocess.Popen | None = None
        self.pushed: list[str] = []
        self.docker_config = self.dir / "docker-config"
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca = _cert("backendai-test registry CA", ca_key, ca=True)
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _cert("127.0.0.1", key, ca.subject, ca_key)
        self.ca_pem = _pem(ca)
        (self.dir / "ca.crt").write_bytes(self.ca_pem)
        (self.dir / "server.crt").write_bytes(_pem(cert) + self.ca_pem)
        (self.dir / "server.key").write_bytes(_pem(key))
        hashed = bcrypt.hashpw(self.password.encode(), bcrypt.gensalt(rounds=5)).decode()
        (self.dir / "htpasswd").write_text(f"{username}:{hashed}\n")
        (self.dir / "config.yml").write_text(
            "version: 0.1\n"
            "log:\n  level: warn\n  accesslog:\n    disabled: true\n"
            f"storage:\n  filesystem:\n    rootdirectory: {self.dir / 'data'}\n"
            "  delete:\n    enabled: true\n"
            f"http:\n  addr: 127.0.0.1:{self.port}\n"
            f"  tls:\n    certificate: {self.dir / 'server.crt'}\n"
            f"    key: {self.dir / 'server.key'}\n"
            f"auth:\n  htpasswd:\n    realm: backendai-test\n    path: {self.dir / 'htpasswd'}\n"
        )

    def start(self) -> Registry:
        certs = CERTS_D / self.host
        certs.mkdir(parents=True, exist_ok=True)
        (certs / "ca.crt").write_bytes(self.ca_pem)
        self.log = open(self.dir / "registry.log", "wb")
        self.proc = subprocess.Popen(
            ["docker-registry", "serve", str(self.dir / "config.yml")],
            stdout=self.log, stderr=subprocess.STDOUT,
        )
        wait_port(self.port, 30, self.proc)
        self.docker("login", "-u", self.username, "--password-stdin", self.host,
                    input=self.password)
        return self

    def docker(self, *args: str, input: str | None = None) -> str:
        r = subprocess.run(
            ["docker", "--config", str(self.docker_config), *args],
            input=input, capture_output=True, text=True, timeout=600,
        )
        if r.returncode != 0:
            raise RuntimeError(f"docker {' '.join(args)}: {r.stderr.strip() or r.stdout.strip()}")
        return r.stdout

    def ssl_context(self):
        import ssl

        return ssl.create_default_context(cadata=self.ca_pem.decode())

    def push(self, local: str, repo: str, tag: str) -> str:
        """Tag ``local`` as ``<host>/<repo>:<tag>``, push it, drop the tag from the engine
        again; returns the pushed reference."""
        ref = f"{self.host}/{repo}:{tag}"
        self.docker("tag", local, ref)
        try:
            self.docker("push", "-q", ref)
        finally:
            subprocess.run(["docker", "rmi", ref], capture_output=True)
        self.pushed.append(ref)
        return ref

    def add_tags(self, repo: str, tag: str, names: list[str]) -> None:
        """Tag ``<repo>:<tag>`` once more under each of ``names``, through the registry
        API (the manifest put again under each name: no engine involved)."""
        import base64
        import urllib.request
        from concurrent.futures import ThreadPoolExecutor

        auth = "Basic " + base64.b64encode(f"{self.username}:{self.password}".encode()).decode()
        ctx = self.ssl_context()
        accept = "application/vnd.docker.distribution.manifest.v2+json"
        req = urllib.request.Request(f"{self.url}/v2/{repo}/manifests/{tag}",
                                     headers={"Authorization": auth, "Accept": accept})
        with urllib.request.urlopen(req, context=ctx, timeout=30) as r:
            body, ctype = r.read(), r.headers["Content-Type"]

        def put(name: str) -> None:
            req = urllib.request.Request(
                f"{self.url}/v2/{repo}/manifests/{name}", data=body, method="PUT",
                headers={"Authorization": auth, "Content-Type": ctype})
            with urllib.request.urlopen(req, context=ctx, timeout=30) as r:
                assert r.status == 201, r.status

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(put, names))

    def references(self) -> list[str]:
        """The engine's references to images from this registry: ``<host>/<repo>:<tag>``
        and ``<host>/<repo>@sha256:...`` (an image pulled by digest has only that)."""
        listed = subprocess.run(["docker", "images", "-a", "--digests", "--format",
                                 "{{.Repository}} {{.Tag}} {{.Digest}}"],
                                capture_output=True, text=True)
        refs = set()
        for line in listed.stdout.splitlines():
            repo, tag, digest = (line.split() + ["", "", ""])[:3]
            if not repo.startswith(self.host + "/"):
                continue
            if tag and tag != "<none>":
                refs.add(f"{repo}:{tag}")
            if digest and digest != "<none>":
                refs.add(f"{repo}@{digest}")
        return sorted(refs)

    def stop(self) -> None:
        """Stop the registry and remove the engine's references to its images, by
        reference, never by image id: an image pulled from here often is, byte for byte,
        one that another test holds under another name (the kernel image pushed as it
        is), and removing the id with ``-f`` took every name of it, another worker's
        too. The image itself goes with its last reference."""
        stop_process(self.proc)
        remove_images(*self.references())
        if getattr(self, "log", None):
            self.log.close()
        shutil.rmtree(CERTS_D / self.host, ignore_errors=True)
        shutil.rmtree(self.dir, ignore_errors=True)


def build_labelled(tmp: Path, repo: str, labels: dict[str, str], variant: str = "",
                   base: str = "backendai/python-kernel:latest") -> str:
    """A small image ``FROM`` the kernel image with ``labels`` and a marker file
    (``/etc/backendai-test-image``, its tag), tagged with :func:`image_tag` and a token
    of this call (two tests building one repo and variant at once never share a tag)."""
    tag = image_tag(repo, "-".join(filter(None, (variant, secrets.token_hex(3)))))
    d = tmp / f"img-{secrets.token_hex(3)}"
    d.mkdir(parents=True)
    (d / "marker").write_text(tag + "\n")
    lines = [f"FROM {base}", "COPY marker /etc/backendai-test-image"]
    for k, v in labels.items():
        lines.append(f'LABEL "{k}"="{v}"')
    (d / "Dockerfile").write_text("\n".join(lines) + "\n")
    r = subprocess.run(["docker", "build", "-q", "-t", tag, str(d)], capture_output=True,
                       text=True, timeout=600)
    if r.returncode:
        raise RuntimeError(f"docker build of {tag} failed: {r.stderr.strip()[-2000:]}")
    return tag


def remove_images(*refs: str) -> None:
    if refs:
        subprocess.run(["docker", "rmi", "-f", *refs], capture_output=True)


def image_present(ref: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", ref], capture_output=True).returncode == 0

