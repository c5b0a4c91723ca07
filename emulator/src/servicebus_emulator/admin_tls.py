"""The emulator's TLS: a certificate authority made at start, a server certificate it signs for the
namespaces' hosts, and the server's SSL context, shared by the administration API (HTTPS) and the AMQP
listeners over TLS and WebSockets.

``ServiceBusAdministrationClient`` speaks HTTPS only, and a real namespace's AMQP is TLS, so the emulator
needs a certificate its clients can trust: they pass the authority's PEM file as ``connection_verify=<path>``.

Invariants:
- the server certificate names 127.0.0.1, ::1 and localhost and every namespace host (subjectAltName: IP
  addresses as IP entries, names as DNS entries), so a client checking host names accepts it on any of them
  (unless the names are given: a test of a host name the certificate does not name);
- the server's private key is written with mode 0600; the authority's key is never written, so nothing
  else can be signed with it once the certificates are made;
- the authority is a separate certificate (CA:TRUE, keyCertSign) from the server's (CA:FALSE, serverAuth),
  as strict X.509 checking (Python 3.13's default context) requires.
"""
from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
from dataclasses import dataclass
from typing import Iterable, List, Optional

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

ALWAYS_NAMED = ("127.0.0.1", "::1", "localhost")
VALID_DAYS = 365
CA_FILE, CERT_FILE, KEY_FILE = "ca.pem", "server-cert.pem", "server-key.pem"


@dataclass(frozen=True)
class TlsFiles:
    """Where the PEM files are: ``ca_file`` is what clients trust; the others are the server's."""
    ca_file: str
    cert_file: str
    key_file: str


def subject_alt_names(hosts: Iterable[str]) -> List[x509.GeneralName]:
    """IP entries for addresses, DNS entries for names; each once, in order."""
    names: List[x509.GeneralName] = []
    for host in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def write_certificates(directory: str, hosts: Iterable[str], names: Optional[Iterable[str]] = None) -> TlsFiles:
    """Make an authority and a server certificate for ``hosts`` and ``ALWAYS_NAMED`` (or for ``names`` only,
    when given), valid from a day ago for ``VALID_DAYS``, and write them to ``directory`` as PEM; returns the
    paths."""
    named = list(names) if names is not None else [*ALWAYS_NAMED, *hosts]
    now = datetime.datetime.now(datetime.timezone.utc)
    not_before, not_after = now - datetime.timedelta(days=1), now + datetime.timedelta(days=VALID_DAYS)
    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "servicebus-emulator local authority")])
    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca = (x509.CertificateBuilder()
          .subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(not_before).not_valid_after(not_after)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(ca_ski, critical=False)
          .sign(ca_key, hashes.SHA256()))
    server = (x509.CertificateBuilder()
              .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "servicebus-emulator")]))
              .issuer_name(ca_name).public_key(server_key.public_key())
              .serial_number(x509.random_serial_number()).not_valid_before(not_before).not_valid_after(not_after)
              .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
              .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=False, crl_sign=False,
                                           content_commitment=False, key_encipherment=False,
                                           data_encipherment=False, key_agreement=False, encipher_only=False,
                                           decipher_only=False), critical=True)
              .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
              .add_extension(x509.SubjectAlternativeName(subject_alt_names(named)), critical=False)
              .add_extension(x509.SubjectKeyIdentifier.from_public_key(server_key.public_key()), critical=False)
              .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
              .sign(ca_key, hashes.SHA256()))
    files = TlsFiles(*(os.path.join(directory, name) for name in (CA_FILE, CERT_FILE, KEY_FILE)))
    _write(files.ca_file, ca.public_bytes(serialization.Encoding.PEM), 0o644)
    _write(files.cert_file, server.public_bytes(serialization.Encoding.PEM), 0o644)
    _write(files.key_file, server_key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                    serialization.NoEncryption()), 0o600)
    return files


def server_context(files: TlsFiles) -> ssl.SSLContext:
    """An SSL context serving the server certificate, TLS 1.2 or later."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(files.cert_file, files.key_file)
    return context


def _write(path: str, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chmod(path, mode)          # an existing file keeps its old mode through os.open
