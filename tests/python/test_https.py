"""The official `anthropic` and `openai` Python SDKs over HTTPS: the gateway's `[tls]` with a
certificate of a CA made here (openssl), trusted by the clients through that CA only."""

import ssl
import subprocess

import anthropic
import httpx2 as httpx
import openai
import pytest

from gateway import SIMULATED_FLEET, running

MODEL = "sim-llama-3-8b"
KEY = "sk-https-sdk-test"


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def certificates(tmp_path_factory):
    """A CA, and a certificate it signs for localhost and 127.0.0.1 (ECDSA P-256)."""
    d = tmp_path_factory.mktemp("tls")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *ec, "-days", "2", "-subj", "/CN=test CA", "-keyout", "ca.key", "-out", "ca.crt", cwd=d)
    openssl("req", *ec, "-subj", "/CN=localhost", "-keyout", "tls.key", "-out", "tls.csr", cwd=d)
    with open(d / "san.ext", "w") as f:
        f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    openssl(
        "x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-days", "2", "-extfile", "san.ext", "-out", "tls.crt", cwd=d,
    )
    return {name: str(d / name) for name in ("ca.crt", "tls.crt", "tls.key")}


@pytest.fixture(scope="module")
def gateway_url(certificates):
    config = f"""
models = ["{MODEL}"]
[[api_keys]]
key = "{KEY}"
[tls]
cert = "{certificates['tls.crt']}"
key = "{certificates['tls.key']}"
{SIMULATED_FLEET}
"""
    with running(config, ca_file=certificates["ca.crt"]) as url:
        yield url


def test_the_anthropic_sdk_over_https(gateway_url, certificates):
    assert gateway_url.startswith("https://")
    client = anthropic.Anthropic(
        base_url=gateway_url,
        api_key=KEY,
        max_retries=0,
        http_client=anthropic.DefaultHttpxClient(verify=ssl.create_default_context(cafile=certificates["ca.crt"])),
    )
    message = client.messages.create(
        model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "Hello over TLS"}]
    )
    assert message.content[0].text
    with client.messages.stream(
        model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "Stream over TLS"}]
    ) as stream:
        text = "".join(stream.text_stream)
    assert text


def test_the_openai_sdk_over_https_with_http2(gateway_url, certificates):
    client = openai.OpenAI(
        base_url=gateway_url + "/v1",
        api_key=KEY,
        max_retries=0,
        http_client=openai.DefaultHttpxClient(verify=ssl.create_default_context(cafile=certificates["ca.crt"])),
    )
    completion = client.chat.completions.create(
        model=MODEL, max_tokens=8, messages=[{"role": "user", "content": "Hello over TLS"}]
    )
    assert completion.choices[0].message.content
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            max_tokens=8,
            stream=True,
            messages=[{"role": "user", "content": "Stream over TLS"}],
        )
    )
    assert any(c.choices and c.choices[0].delta.content for c in chunks)
    # HTTP/2 over TLS, agreed by ALPN (httpx with h2).
    with httpx.Client(http2=True, verify=ssl.create_default_context(cafile=certificates["ca.crt"])) as h:
        r = h.get(gateway_url + "/v1/models", headers={"authorization": f"Bearer {KEY}"})
        assert r.status_code == 200
        assert r.http_version == "HTTP/2"


def test_a_client_that_does_not_trust_the_ca_is_refused_in_the_handshake(gateway_url):
    client = openai.OpenAI(
        base_url=gateway_url + "/v1",
        api_key=KEY,
        max_retries=0,
        # The system's roots only: the test CA is in none of them.
        http_client=openai.DefaultHttpxClient(verify=True),
    )
    with pytest.raises(openai.APIConnectionError) as err:
        client.models.list()
    assert "CERTIFICATE_VERIFY_FAILED" in str(err.value.__cause__), repr(err.value.__cause__)
