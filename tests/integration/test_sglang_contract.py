"""Our engine protocol against SGLang's own request structs (issue 20 item 5).

Both directions, with a real engine server process and the structs of the installed `sglang` package
(tests/integration/sglang_structs.py says how they load without SGLang's engine):
- every request our client (trainer/engine_client.py) sends, captured on its way to our server, is
  parsed by SGLang's struct for that endpoint as SGLang's HTTP server parses it; the weights it sends
  are read back with SGLang's own MultiprocessingSerializer (its allow-listed unpickler);
- every body built with SGLang's structs, as an SGLang client (Miles) sends it, is accepted by our
  server, and our replies parse as SGLang's reply structs.
No SGLang server runs here (it needs a GPU and its whole engine): the structs are the evidence.
Skipped without the package: `bash scripts/install_sglang_contract.sh` installs it.
"""
from __future__ import annotations

import dataclasses
import json
import urllib.request

import pytest
import torch

import sglang_structs
from trainer import engine_http as api
from trainer.config import ModelConfig
from trainer.engine_client import RemoteEngine

pytestmark = pytest.mark.slow
CFG = ModelConfig(vocab_size=16, d_model=32, n_layer=2, n_head=4, max_seq_len=12)
KV_BYTES = 64 * CFG.max_seq_len * CFG.kv_bytes_per_token(4)
# Our endpoints that SGLang's server also has, and the struct its handler parses the body with.
POST_STRUCTS = {api.GENERATE: "GenerateReqInput", api.RELEASE: "ReleaseMemoryOccupationReqInput",
                api.RESUME: "ResumeMemoryOccupationReqInput", api.UPDATE_WEIGHTS: "UpdateWeightsFromTensorReqInput"}
NO_BODY = {api.HEALTH, api.SERVER_INFO, api.FLUSH_CACHE}  # SGLang's take no body (flush_cache: a query only)
OURS_ONLY = {api.MEMORY}  # not SGLang's: the client calls it only on our server (RemoteEngine.ours)


@pytest.fixture(scope="module")
def sgl():
    try:
        structs = sglang_structs.load()
    except ImportError as exc:
        pytest.skip(f"sglang's structs not loadable ({exc}): bash scripts/install_sglang_contract.sh")
    yield structs
    sglang_structs.unload()


class CapturingEngine(RemoteEngine):
    """The real client, its requests kept (and the weights read back as SGLang would, while they are
    still shared) on their way to the real server."""
    sent: list = []
    weights: list = []
    sgl = None

    def _request(self, method, path, body=None):
        type(self).sent.append((method, path, json.loads(json.dumps(body)) if body is not None else None))
        if path == api.UPDATE_WEIGHTS:
            parsed = sglang_structs.parse(self.sgl.UpdateWeightsFromTensorReqInput, body)
            named = self.sgl.MultiprocessingSerializer.deserialize(parsed.serialized_named_tensors[0])
            type(self).weights.append([(name, tensor.clone()) for name, tensor in named])
            del named
        return super()._request(method, path, body)


@pytest.fixture(scope="module")
def engine(sgl):
    CapturingEngine.sgl = sgl
    engine = CapturingEngine.start(CFG, torch.device("cpu"), KV_BYTES)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def driven(engine):
    """One round of everything the training loop asks of the engine."""
    from trainer.model import GPT, init_weights
    model = GPT(CFG)
    init_weights(model, torch.Generator().manual_seed(0))
    named = [(n, p.detach().clone()) for n, p in model.named_parameters()]
    engine.update_weights_from_tensor(named)
    engine.generate(torch.randint(0, 16, (3, 4), generator=torch.Generator().manual_seed(1)), 5, seed=7)
    for tags in (["kv_cache"], ["weights", "kv_cache"]):
        engine.occupied_bytes(tags)
        engine.release_memory_occupation(tags)
        engine.released_bytes(tags)
        engine.resume_memory_occupation(tags)
    engine.update_weights_from_tensor(named)
    engine.flush_cache()
    return named, CapturingEngine.sent


def test_every_request_our_client_sends_parses_with_sglangs_struct(sgl, driven):
    _, sent = driven
    used = {path for _, path, _ in sent}
    assert used - set(POST_STRUCTS) <= NO_BODY | OURS_ONLY, used  # no endpoint unaccounted for
    assert set(POST_STRUCTS) <= used  # and every SGLang endpoint we have was exercised
    for method, path, body in sent:
        if path in POST_STRUCTS:
            assert method == "POST"
            struct = getattr(sgl, POST_STRUCTS[path])
            if path == api.GENERATE:  # a dataclass: SGLang builds it and normalizes the batch
                request = struct(**body)
                request.normalize_batch_and_arguments()
                assert request.batch_size == len(body["input_ids"]) and not request.is_single
                for params in request.sampling_params:
                    sgl.SamplingParams(**params).verify(CFG.vocab_size)
            else:
                parsed = sglang_structs.parse(struct, body)
                if "tags" in body:
                    assert parsed.tags == body["tags"]
        elif path in NO_BODY:
            assert body in (None, {}), (path, body)


def test_the_weights_we_send_are_read_back_by_sglangs_serializer(driven):
    named, _ = driven
    (first, *_), expected = CapturingEngine.weights, dict(named)
    assert [n for n, _ in first] == list(expected)
    assert all(torch.equal(t, expected[n]) for n, t in first)


def _post(engine, path: str, body) -> tuple[int, object]:
    request = urllib.request.Request(engine.url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        payload = response.read()
        return response.status, json.loads(payload) if payload else None


def _fields(struct) -> dict:
    """A struct as an SGLang client (Miles) sends it: a JSON object of every field."""
    import msgspec
    return msgspec.structs.asdict(struct)


def test_bodies_built_with_sglangs_structs_are_accepted_and_our_replies_parse(sgl, engine, driven):
    named, _ = driven
    for struct in (sgl.ReleaseMemoryOccupationReqInput, sgl.ResumeMemoryOccupationReqInput):
        for tags in (["kv_cache"], None):  # None: every tag, as SGLang reads it
            path = api.RELEASE if "Release" in struct.__name__ else api.RESUME
            status, reply = _post(engine, path, _fields(struct(tags=tags)))
            assert status == 200 and reply is None  # SGLang's handlers answer null
    payload = sgl.MultiprocessingSerializer.serialize(named, output_str=True)
    update = sgl.UpdateWeightsFromTensorReqInput(serialized_named_tensors=[payload.encode()], flush_cache=True)
    body = _fields(update)
    body["serialized_named_tensors"] = [payload]  # base64 text over HTTP
    status, reply = _post(engine, api.UPDATE_WEIGHTS, body)
    assert status == 200
    out = sglang_structs.parse(sgl.UpdateWeightsFromTensorReqOutput, reply)
    assert out.success is True
    generate = sgl.GenerateReqInput(input_ids=[[1, 2, 3], [4, 5, 6]],
                                    sampling_params={"max_new_tokens": 4, "temperature": 1.0, "sampling_seed": 3})
    status, replies = _post(engine, api.GENERATE, json.loads(json.dumps(dataclasses.asdict(generate), default=str)))
    assert status == 200 and len(replies) == 2
    for reply in replies:  # what Miles reads of each output
        assert len(reply["output_ids"]) == 4 and reply["meta_info"]["finish_reason"]["type"] == "length"
        assert reply["meta_info"]["completion_tokens"] == 4



def test_a_single_prompt_as_miles_sends_one_sample_gets_one_reply(sgl, engine, driven):
    request = sgl.GenerateReqInput(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 2, "temperature": 1.0})
    request.normalize_batch_and_arguments()
    assert request.is_single  # SGLang reads a flat list as one prompt ...
    status, reply = _post(engine, api.GENERATE, {"input_ids": [1, 2, 3],
                                                 "sampling_params": {"max_new_tokens": 2, "temperature": 1.0}})
    assert status == 200 and isinstance(reply, dict) and len(reply["output_ids"]) == 2  # ... and answers one object
