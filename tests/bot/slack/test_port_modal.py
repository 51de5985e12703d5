"""`/kernel port`: the form to paste or upload a kernel (pure rendering, parsing and static problems), then end to
end through the real Bolt app over signed HTTP against the fake Slack Web API: a PyTorch module pasted or uploaded
becomes a task, and the buttons on the result start a HITL or an Auto session in the channel."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import Session, select

from bot.slack.app import build_app
from bot.slack.views.port_form import (
    FILE,
    NAME,
    PORT_CALLBACK,
    PORTED_CALLBACK,
    SOURCE,
    START_AUTO,
    START_HITL,
    STARTED_CALLBACK,
    TORCH_REFERENCE,
    PortSubmission,
    UploadedFile,
    parse_submission,
    port_form,
    ported_view,
    porting_view,
    read_start_value,
    source_kind,
    started_view,
    static_problems,
)
from storage.connect import open_database
from storage.models import Job, KernelSession
from storage.settings import Settings, load_settings
from tests.conftest import CORPUS
from tests.fakes.anthropic_api import API_KEY, FakeAnthropic, fake_anthropic
from tests.fakes.slack_api import BOT_TOKEN, fake_slack
from tests.support.bot import Served, bot_app
from tests.support.reading import wait_for
from tests.support.slack_http import SECRET, command, interaction, served, submit_view
from tpu_runner.porting import PortResult
from tpu_runner.tasks import read_task_files

SOURCES = CORPUS / "port_sources"

SCALED_RELU = '''\
import torch
import torch.nn as nn


class Model(nn.Module):
    """ReLU, then a learned scale per feature."""

    def __init__(self, features):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(features))

    def forward(self, x):
        return torch.relu(x) * self.scale


def get_inputs():
    return [torch.randn(8, 128)]


def get_init_inputs():
    return [128]
'''

ROW_SOFTMAX = '''\
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.softmax(x, dim=-1)


def get_inputs():
    return [torch.randn(4, 256)]


def get_init_inputs():
    return []
'''

FORWARD_RAISES = '''\
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x @ torch.ones(3, 3)


def get_inputs():
    return [torch.randn(8, 128)]


def get_init_inputs():
    return []
'''

NO_MODEL = '''\
import torch
import torch.nn as nn


class Net(nn.Module):
    def forward(self, x):
        return x * 2


def get_inputs():
    return [torch.randn(8, 128)]
'''

CUDA = '''\
__global__ void scale(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i];
}
'''

TRITON = '''\
import triton
import triton.language as tl


@triton.jit
def scale_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, 2.0 * tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)
'''


def submission(**changes: Any) -> PortSubmission:
    base = PortSubmission(name="scaled_relu", source=SCALED_RELU, files=(), torch_reference="", channel="C1")
    return replace(base, **changes)


def state(sub: PortSubmission, *, files: list[dict[str, Any]] | None = None) -> dict[str, dict[str, dict[str, Any]]]:
    """The `state.values` Slack sends for a form filled in with `sub` (`files`: the uploaded files' objects)."""
    def text(value: str) -> dict[str, dict[str, Any]]:
        return {"value": {"type": "plain_text_input", "value": value or None}}

    uploaded = files if files is not None else [{"id": f.id, "name": f.name} for f in sub.files]
    return {NAME: text(sub.name), SOURCE: text(sub.source), TORCH_REFERENCE: text(sub.torch_reference),
            FILE: {"value": {"type": "file_input", "files": uploaded}}}


def blocks_by_id(view: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {b["block_id"]: b for b in view["blocks"] if "block_id" in b}


def all_text(view: dict[str, Any]) -> str:
    return json.dumps(view["blocks"], ensure_ascii=False)


def view_buttons(view: dict[str, Any]) -> dict[str, str]:
    return {e["action_id"]: e["value"] for b in view["blocks"] if b["type"] == "actions" for e in b["elements"]}


PORTED = PortResult(ok=True, name="scaled_relu", task_dir=Path("/x/scaled_relu"),
                    signature=("x: float32[8,128] (input)", "scale: float32[128] (weight)"),
                    outputs=("float32[8,128]",), max_abs_err=0.0, verified_by="torchax")


# --- the form, pure --------------------------------------------------------------------------------------------------


def test_the_form_offers_a_paste_box_a_file_and_a_reference_within_slacks_limits() -> None:
    view = port_form(channel="C9")
    assert view["callback_id"] == PORT_CALLBACK and json.loads(view["private_metadata"]) == {"channel": "C9"}
    for label in (view["title"], view["submit"], view["close"]):
        assert len(label["text"]) <= 24
    inputs = blocks_by_id(view)
    assert list(inputs) == [NAME, SOURCE, FILE, TORCH_REFERENCE]
    assert inputs[SOURCE]["element"]["multiline"] and inputs[SOURCE]["element"]["max_length"] == 3000
    assert inputs[TORCH_REFERENCE]["element"]["max_length"] == 3000
    assert inputs[FILE]["element"]["type"] == "file_input" and inputs[FILE]["element"]["max_files"] == 1
    assert set(inputs[FILE]["element"]["filetypes"]) == {"py", "cu", "cuh"}
    assert [inputs[b]["optional"] for b in (NAME, SOURCE, FILE, TORCH_REFERENCE)] == [False, True, True, True]
    assert ":warning:" not in all_text(view)


def test_a_form_shown_again_keeps_what_was_typed_and_says_what_went_wrong() -> None:
    typed = submission(source=TRITON, torch_reference=ROW_SOFTMAX)
    view = port_form(channel="C1", values=typed, error="the module's forward raised in PyTorch (line 7)")
    inputs = blocks_by_id(view)
    assert inputs[NAME]["element"]["initial_value"] == "scaled_relu"
    assert inputs[SOURCE]["element"]["initial_value"] == TRITON
    assert inputs[TORCH_REFERENCE]["element"]["initial_value"] == ROW_SOFTMAX
    first = view["blocks"][0]["text"]["text"]
    assert "nothing was written" in first and "forward raised in PyTorch (line 7)" in first
    assert "Upload the file again" not in first
    assert parse_submission({**view, "state": {"values": state(typed)}}) == typed
    uploaded = submission(source="", files=(UploadedFile("F1", "m.py"),))
    assert "Upload the file again" in port_form(channel="C1", values=uploaded, error="x")["blocks"][0]["text"]["text"]


def test_parsing_reads_the_uploaded_file_and_strips_a_pasted_fence() -> None:
    fenced = submission(source="```python\n" + SCALED_RELU + "```\n")
    parsed = parse_submission({**port_form(channel="C7"), "state": {"values": state(fenced)}})
    assert parsed.source == SCALED_RELU and parsed.channel == "C7" and parsed.files == ()
    upload = submission(source="", files=(UploadedFile("F00042", "layernorm.py"),))
    parsed = parse_submission({**port_form(channel="C7"), "state": {"values": state(upload)}})
    assert parsed.files == (UploadedFile("F00042", "layernorm.py"),) and parsed.source == ""
    assert parsed.source_name == "layernorm.py" and submission().source_name == "pasted"


def test_what_kind_of_source_it_is() -> None:
    assert source_kind("the paste", SCALED_RELU) == ("pytorch", None)
    assert source_kind("the paste", CUDA)[0] == "cuda" and source_kind("scale.cu", "anything")[0] == "cuda"
    assert source_kind("k.py", TRITON)[0] == "triton"
    kind, unknown = source_kind("net.py", NO_MODEL)
    assert kind is None and "net.py defines no `class Model(nn.Module)` (it has Net)" in str(unknown)


def test_static_problems_name_the_input_and_the_fix() -> None:
    assert static_problems(submission()) == {}
    assert static_problems(submission(source="", files=(UploadedFile("F1", "m.py"),))) == {}
    assert static_problems(submission(source=CUDA, torch_reference=ROW_SOFTMAX)) == {}
    assert "Paste the kernel here, or upload" in static_problems(submission(source=""))[SOURCE]
    both = static_problems(submission(files=(UploadedFile("F1", "m.py"),)))
    assert list(both) == [FILE] and "not both" in both[FILE]
    assert "not a kernel source" in static_problems(submission(source="", files=(UploadedFile("F1", "a.pdf"),)))[FILE]
    assert "'My-Relu' is not a task name" in static_problems(submission(name="My-Relu"))[NAME]
    assert "Give the task a name" in static_problems(submission(name=""))[NAME]
    broken = SCALED_RELU.replace("def forward(self, x):", "def forward(self, x)")
    assert static_problems(submission(source=broken))[SOURCE].startswith("Line 12: syntax error")
    assert "The paste defines no `class Model(nn.Module)` (it has Net)" in static_problems(
        submission(source=NO_MODEL))[SOURCE]
    assert "only for a CUDA or Triton source" in static_problems(submission(torch_reference=ROW_SOFTMAX))[
        TORCH_REFERENCE]
    assert "syntax error" in static_problems(submission(source=CUDA, torch_reference="def (:"))[TORCH_REFERENCE]
    assert "must be a PyTorch module" in static_problems(submission(source=CUDA, torch_reference=TRITON))[
        TORCH_REFERENCE]


def test_a_name_taken_by_another_task_is_refused_but_the_same_source_again_is_not() -> None:
    ported = {"reference.py": "# The original module:\n#\n" + "\n".join(f"# {line}".rstrip() for line in
                                                                         SCALED_RELU.strip().splitlines()),
              "kernel_task.yaml": "task_id: scaled_relu\n"}
    assert static_problems(submission(), existing=ported) == {}
    other = static_problems(submission(source=ROW_SOFTMAX), existing=ported)
    assert list(other) == [NAME] and "already exists with different content" in other[NAME]
    assert "/kernel new scaled_relu" in other[NAME]


def test_the_porting_ported_and_started_views_say_what_happens() -> None:
    porting = porting_view(submission())
    assert "submit" not in porting and "Porting *scaled_relu*" in all_text(porting)
    assert "torchax" in all_text(porting)
    assert "fetching `k.cu` from Slack" in all_text(porting_view(submission(source="",
                                                                            files=(UploadedFile("F1", "k.cu"),))))
    view = ported_view(PORTED, channel="C4", kind="pytorch", source_name="pasted")
    text = all_text(view)
    assert view["callback_id"] == PORTED_CALLBACK and "submit" not in view
    assert "`x: float32[8,128] (input)`" in text and "`scale: float32[128] (weight)`" in text
    assert "max |diff| 0 " in text and "Not verified" not in text and "<#C4>" in text
    buttons = view_buttons(view)
    assert list(buttons) == [START_HITL, START_AUTO]
    assert {read_start_value(v) for v in buttons.values()} == {("scaled_relu", "C4")}
    unverified = replace(PORTED, max_abs_err=None, verified_by=None)
    assert "Not verified by an oracle" in all_text(ported_view(unverified, channel="C4", kind="cuda",
                                                               source_name="k.cu"))
    with pytest.raises(ValueError, match="carries no task"):
        read_start_value("nonsense")
    started = all_text(started_view("s-9", mode="auto", task="scaled_relu", channel="C4", target="v6e",
                                    brain="offline"))
    assert "Started Auto session `s-9`" in started and "<#C4>" in started


# --- the fake's file downloads ---------------------------------------------------------------------------------------


def test_an_uploaded_file_downloads_only_with_the_bot_token() -> None:
    with fake_slack() as fake:
        file_id = fake.add_upload("relu.py", SCALED_RELU)
        url = fake.file_object(file_id)["url_private_download"]
        assert url.startswith(fake.base_url) and url.endswith("/relu.py")
        for headers in ({}, {"Authorization": "Bearer xoxb-someone-else"}):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5)
            assert refused.value.code == 401
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {BOT_TOKEN}"})
        with urllib.request.urlopen(request, timeout=5) as response:
            assert response.read().decode() == SCALED_RELU
        assert fake.downloads == [file_id]


# --- end to end ----------------------------------------------------------------------------------------------------


@pytest.fixture
def served_app(tmp_path: Path) -> Iterator[Served]:
    with bot_app(tmp_path / "home") as app:
        yield app


def open_form(app: Served, channel: str = "C1") -> dict[str, Any]:
    status, _ = command(app.url, "port", fake=app.fake, channel=channel, trigger_id="trigger-7", answered=False)
    assert status == 200
    wait_for("the form to open", lambda: any(method == "views.open" for method, _ in app.fake.calls), timeout=10)
    opened = [args for method, args in app.fake.calls if method == "views.open"]
    assert opened[-1]["trigger_id"] == "trigger-7"
    view = app.fake.views[sorted(app.fake.views)[-1]]
    assert view["callback_id"] == PORT_CALLBACK
    return view


def updated_view(app: Served, view_id: str, timeout: float = 180.0) -> dict[str, Any]:
    """The view once the background port has updated it."""
    wait_for(f"view {view_id} to be updated", lambda: any(
        method == "views.update" and args.get("view_id") == view_id for method, args in app.fake.calls), timeout)
    return app.fake.views[view_id]


def click_in_view(app: Served, view: dict[str, Any], action_id: str, *, user: str) -> None:
    """A click on a button of a modal, as Slack sends it (the container is the view, there is no channel)."""
    value = view_buttons(view)[action_id]
    status, _ = interaction(app.url, {
        "type": "block_actions", "user": {"id": user, "username": user}, "team": {"id": "T0001"},
        "api_app_id": "A0001", "trigger_id": f"trigger-{time.monotonic_ns()}",
        "container": {"type": "view", "view_id": view["id"]}, "view": view,
        "actions": [{"action_id": action_id, "block_id": "start", "type": "button", "value": value,
                     "action_ts": str(time.time())}]})
    assert status == 200


def sessions_of(settings: Settings) -> list[KernelSession]:
    with Session(open_database(settings)) as s:
        return list(s.exec(select(KernelSession)).all())


def jobs_of(settings: Settings, session_id: str) -> list[tuple[str, str]]:
    with Session(open_database(settings)) as s:
        return [(j.kind, j.status) for j in s.exec(select(Job).where(Job.session_id == session_id)).all()]


def test_kernel_port_opens_the_form_and_static_problems_are_shown_in_it(served_app: Served) -> None:
    view = open_form(served_app, channel="C3")
    assert json.loads(view["private_metadata"]) == {"channel": "C3"}
    status, body = submit_view(served_app.url, view, state(submission(source="")))
    assert status == 200 and body["response_action"] == "errors" and list(body["errors"]) == [SOURCE]
    status, body = submit_view(served_app.url, view, state(submission(name="Scaled ReLU")))
    assert status == 200 and body["response_action"] == "errors"
    assert "'Scaled ReLU' is not a task name" in body["errors"][NAME]
    file_id = served_app.fake.add_upload("relu.py", SCALED_RELU)
    status, body = submit_view(served_app.url, view, state(submission(files=(UploadedFile(file_id, "relu.py"),))))
    assert body["response_action"] == "errors" and "not both" in body["errors"][FILE]
    assert not any(method in ("views.update", "files.info") for method, _ in served_app.fake.calls)
    assert served_app.fake.downloads == [] and sessions_of(served_app.settings) == []


def test_a_pasted_module_ports_and_start_a_hitl_session_starts_one_in_the_channel(served_app: Served) -> None:
    view = open_form(served_app)
    status, body = submit_view(served_app.url, view, state(submission()), user="U7")
    assert status == 200 and body["response_action"] == "update"
    assert "Porting *scaled_relu*" in all_text(body["view"])
    ported = updated_view(served_app, view["id"])
    assert ported["callback_id"] == PORTED_CALLBACK, all_text(ported)
    text = all_text(ported)
    assert "`x: float32[8,128] (input)`" in text and "`scale: float32[128] (weight)`" in text
    assert "`float32[8,128]`" in text and "Checked against PyTorch* through torchax: max |diff| 0" in text
    assert list(view_buttons(ported)) == [START_HITL, START_AUTO]
    task_dir = served_app.settings.home / "tasks" / "scaled_relu"
    files = read_task_files(task_dir)
    assert files and "task_id: scaled_relu" in files["kernel_task.yaml"] and "def computation(" in files[
        "reference.py"]
    assert sessions_of(served_app.settings) == []  # nothing starts before a button is clicked

    click_in_view(served_app, ported, START_HITL, user="U8")
    started = wait_for("the session to start", lambda: served_app.fake.views[view["id"]]["callback_id"]
                       == STARTED_CALLBACK and served_app.fake.views[view["id"]], timeout=10)
    click_in_view(served_app, ported, START_AUTO, user="U8")  # a second click on the same result
    time.sleep(0.5)
    [record] = sessions_of(served_app.settings)  # one session per ported result
    assert (record.mode, record.owner, record.slack_channel, record.task) == ("hitl", "U8", "C1", "scaled_relu")
    assert Path(record.task_dir or "") == task_dir.resolve()
    assert record.budget and record.budget["task_files"] == files and record.budget["iterations"] == 5
    assert jobs_of(served_app.settings, record.id) == [("hitl_advance", "queued")]
    shown = all_text(started)
    assert f"Started HITL session `{record.id}` on *scaled_relu*" in shown and "thread is in <#C1>" in shown
    # The ported task is a task like any other now; the same source again under its name is no problem.
    started = command(served_app.url, "new scaled_relu --brain offline", fake=served_app.fake)[1]["text"]
    assert "Started HITL session" in started
    assert static_problems(submission(), existing=files) == {}


def test_an_uploaded_module_is_fetched_with_the_bot_token_and_ports_the_same_way(served_app: Served) -> None:
    view = open_form(served_app, channel="C5")
    file_id = served_app.fake.add_upload("row_softmax.py", ROW_SOFTMAX)
    uploaded = submission(name="row_softmax", source="", files=(UploadedFile(file_id, "row_softmax.py"),))
    status, body = submit_view(served_app.url, view, state(uploaded), user="U2")
    assert status == 200 and body["response_action"] == "update"
    assert "fetching `row_softmax.py` from Slack" in all_text(body["view"])
    ported = updated_view(served_app, view["id"])
    assert ported["callback_id"] == PORTED_CALLBACK, all_text(ported)
    assert [args["file"] for method, args in served_app.fake.calls if method == "files.info"] == [file_id]
    assert served_app.fake.downloads == [file_id]  # the fake serves the file only with the bot token
    text = all_text(ported)
    assert "`x: float32[4,256] (input)`" in text and "`row_softmax.py`" in text and "max |diff|" in text
    assert "row_softmax.py" in (read_task_files(served_app.settings.home / "tasks" / "row_softmax") or {})[
        "kernel_task.yaml"]

    click_in_view(served_app, ported, START_AUTO, user="U2")
    wait_for("the session to start", lambda: served_app.fake.views[view["id"]]["callback_id"] == STARTED_CALLBACK,
             timeout=10)
    [record] = sessions_of(served_app.settings)
    assert (record.mode, record.owner, record.slack_channel, record.task) == ("auto", "U2", "C5", "row_softmax")
    assert jobs_of(served_app.settings, record.id) == [("auto_session", "queued")]
    assert f"Started Auto session `{record.id}`" in all_text(served_app.fake.views[view["id"]])


def test_a_module_whose_forward_raises_gets_the_form_back_and_writes_nothing(served_app: Served) -> None:
    view = open_form(served_app)
    status, body = submit_view(served_app.url, view, state(submission(name="broken", source=FORWARD_RAISES)))
    assert status == 200 and body["response_action"] == "update"
    final = updated_view(served_app, view["id"])
    assert final["callback_id"] == PORT_CALLBACK
    error = final["blocks"][0]["text"]["text"]
    assert "nothing was written" in error
    assert "the module's forward raised in PyTorch (line 7: `return x @ torch.ones(3, 3)`): RuntimeError" in error
    inputs = blocks_by_id(final)
    assert inputs[SOURCE]["element"]["initial_value"] == FORWARD_RAISES
    assert inputs[NAME]["element"]["initial_value"] == "broken"
    assert not (served_app.settings.home / "tasks" / "broken").exists()
    assert sessions_of(served_app.settings) == []


def test_a_form_from_a_channel_the_bot_cannot_post_to_gets_the_form_back_and_ports_nothing(
        served_app: Served) -> None:
    served_app.fake.add_channel("GSECRET", private=True, members=("U1",), bot=False)
    view = open_form(served_app, channel="GSECRET")
    status, body = submit_view(served_app.url, view, state(submission()))
    assert status == 200 and body["response_action"] == "update"
    final = updated_view(served_app, view["id"], timeout=10)
    assert final["callback_id"] == PORT_CALLBACK
    error = final["blocks"][0]["text"]["text"]
    assert "invite me with `/invite @kernelbot`" in error and "Nothing was started." in error
    assert blocks_by_id(final)[NAME]["element"]["initial_value"] == "scaled_relu"  # what was typed is kept
    assert not (served_app.settings.home / "tasks" / "scaled_relu").exists()
    assert sessions_of(served_app.settings) == []


def test_an_uploaded_file_with_no_model_gets_the_form_back_and_writes_nothing(served_app: Served) -> None:
    view = open_form(served_app)
    file_id = served_app.fake.add_upload("net.py", NO_MODEL)
    submit_view(served_app.url, view, state(submission(name="net", source="", files=(UploadedFile(file_id,
                                                                                                    "net.py"),))))
    error = updated_view(served_app, view["id"])["blocks"][0]["text"]["text"]
    assert "net.py defines no `class Model(nn.Module)` (it has Net): rename" in error
    assert "Upload the file again" in error and served_app.fake.downloads == [file_id]
    assert not (served_app.settings.home / "tasks" / "net").exists()


def test_an_upload_too_large_or_under_a_taken_name_is_refused_before_porting(served_app: Served) -> None:
    view = open_form(served_app)
    big = served_app.fake.add_upload("huge.py", SCALED_RELU + "#" * 1_000_001)
    status, body = submit_view(served_app.url, view, state(submission(source="", files=(UploadedFile(big,
                                                                                                      "huge.py"),))))
    assert body["response_action"] == "update"
    error = updated_view(served_app, view["id"])["blocks"][0]["text"]["text"]
    assert "huge.py is 1,000," in error and "up to 1,000,000 bytes" in error and "Upload the file again" in error
    assert served_app.fake.downloads == []  # refused from files.info's size, never fetched

    again = open_form(served_app)
    relu = served_app.fake.add_upload("relu.py", SCALED_RELU)
    taken = submission(name="softmax", source="", files=(UploadedFile(relu, "relu.py"),))  # a task in tasks/
    submit_view(served_app.url, again, state(taken))
    error = updated_view(served_app, again["id"])["blocks"][0]["text"]["text"]
    assert "A task named softmax already exists with different content" in error
    assert not (served_app.settings.home / "tasks" / "softmax").exists()


# --- CUDA and Triton, through the LLM brain (the fake Messages API) -------------------------------------------------

BIAS_RELU_JAX = (SOURCES / "bias_relu_jax.py").read_text()  # a correct translation of bias_relu.cu

DOUBLE_JAX = '''"""Twice x: f32 x [64, 256]."""

import jax
import jax.numpy as jnp


def computation(x):
    return 2.0 * x


def get_inputs():
    return [jax.random.normal(jax.random.key(0), (64, 256), jnp.float32)], []
'''


@pytest.fixture
def llm_app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Served, FakeAnthropic]]:
    with fake_anthropic() as llm, fake_slack() as fake:
        monkeypatch.setenv("ANTHROPIC_BASE_URL", llm.base_url)
        settings = load_settings({"KERNELBOT_HOME": str(tmp_path / "home"), "SLACK_BOT_TOKEN": BOT_TOKEN,
                                  "SLACK_SIGNING_SECRET": SECRET, "KERNELBOT_SLACK_API_URL": fake.base_url,
                                  "ANTHROPIC_API_KEY": API_KEY})
        with served(build_app(settings, open_database(settings))) as url:
            yield Served(url, fake, settings), llm


def test_a_pasted_cuda_kernel_with_its_pytorch_reference_is_checked_against_it(
        llm_app: tuple[Served, FakeAnthropic]) -> None:
    app, llm = llm_app
    llm.script.append({"text": f"The reference:\n\n```python\n{BIAS_RELU_JAX}```\n"})
    cuda, torch_reference = (SOURCES / "bias_relu.cu").read_text(), (SOURCES / "bias_relu.py").read_text()
    view = open_form(app)
    status, body = submit_view(app.url, view, state(submission(name="bias_relu", source=cuda,
                                                               torch_reference=torch_reference)))
    assert status == 200 and body["response_action"] == "update"
    assert "writing a JAX reference from the CUDA source" in all_text(body["view"])
    ported = updated_view(app, view["id"])
    assert ported["callback_id"] == PORTED_CALLBACK, all_text(ported)
    text = all_text(ported)
    assert "`x: float32[64,256] (input)`" in text and "`bias: float32[256] (weight)`" in text
    assert "Checked against PyTorch* through torchax: max |diff|" in text and "Not verified" not in text
    assert "CUDA source `pasted`" in text and list(view_buttons(ported)) == [START_HITL, START_AUTO]
    assert "__global__ void bias_relu_kernel" in llm.requests[0]["body"]["system"][1]["text"]
    assert "oracle: torchax" in (app.settings.home / "tasks" / "bias_relu" / "kernel_task.yaml").read_text()


def test_an_uploaded_triton_kernel_without_a_reference_is_ported_unverified(
        llm_app: tuple[Served, FakeAnthropic]) -> None:
    app, llm = llm_app
    llm.script.append({"text": f"```python\n{DOUBLE_JAX}```"})
    view = open_form(app)
    file_id = app.fake.add_upload("double.py", TRITON)
    submit_view(app.url, view, state(submission(name="double", source="", files=(UploadedFile(file_id,
                                                                                            "double.py"),))))
    ported = updated_view(app, view["id"])
    assert ported["callback_id"] == PORTED_CALLBACK, all_text(ported)
    text = all_text(ported)
    assert "Triton kernel `double.py`" in text and "`x: float32[64,256]`" in text
    assert "Not verified by an oracle" in text and "max |diff|" not in text
    assert app.fake.downloads == [file_id]


def test_cuda_without_an_llm_brain_gets_the_form_back_saying_what_is_needed(served_app: Served) -> None:
    view = open_form(served_app)
    submit_view(served_app.url, view, state(submission(name="double", source=CUDA)))
    error = updated_view(served_app, view["id"])["blocks"][0]["text"]["text"]
    assert "porting a CUDA source needs the anthropic brain" in error and "ANTHROPIC_API_KEY" in error
    assert not (served_app.settings.home / "tasks" / "double").exists()
