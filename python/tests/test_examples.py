"""The real example trainers (PyTorch + HF ``Trainer``) run as the agent
runs them: a process with the contract's environment, reports on a unix
socket, signals. Tiny randomly initialised models (``--tiny``) on the
synthetic datasets, on the CPU.

Skipped where torch and transformers are missing; ``scripts/test.sh`` runs
this file with the Python of ``scripts/trainer-venv.sh``, which has them.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from fmsched_trainer.examples import synthetic  # noqa: E402

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Agent:
    """The agent's side of one process: its report socket and environment."""

    def __init__(self, tmp, tasks, mode="train", **env):
        self.path = str(tmp / f"r-{time.monotonic_ns()}.sock")
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(self.path)
        self.server.listen(4)
        self.reports = []
        threading.Thread(target=self._accept, daemon=True).start()
        self.env = dict(os.environ)
        self.env.update({
            "FMSCHED_TASKS": json.dumps(tasks),
            "FMSCHED_MODE": mode,
            "FMSCHED_CHECKPOINT_DIR": str(tmp / "ckpt"),
            "FMSCHED_OUTPUT_DIR": str(tmp / "out"),
            "FMSCHED_REPORT_SOCKET": self.path,
            "FMSCHED_CHECKPOINT_INTERVAL_S": "600",
            "PYTHONPATH": PYTHON_DIR,
            "OMP_NUM_THREADS": "1",
            # What the agent gives a 4-GPU node's process (no torchrun).
            "WORLD_SIZE": "4", "RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "4",
        })
        self.env.update({k: str(v) for k, v in env.items()})

    def _accept(self):
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn):
        buf = b""
        while True:
            data = conn.recv(65536)
            if not data:
                return
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                self.reports.append(json.loads(line))

    def start(self, module, *args):
        return subprocess.Popen([sys.executable, "-m", f"fmsched_trainer.examples.{module}", "--tiny", *args],
                                env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def run(self, module, *args, timeout=240):
        p = self.start(module, *args)
        out, err = p.communicate(timeout=timeout)
        time.sleep(0.2)  # the last reports
        return p.returncode, out, err

    def of(self, kind):
        return [r for r in self.reports if r["type"] == kind]


def suspend_after(agent, p, iteration):
    """Suspends process ``p`` as the agent does once it reported
    ``iteration``: SIGUSR2, its checkpoint report, SIGTERM; it must exit 0.
    Returns its standard error."""
    deadline = time.monotonic() + 120
    while not any(r["iteration"] >= iteration for r in agent.of("progress")):
        assert p.poll() is None, p.communicate()[1]
        assert time.monotonic() < deadline
        time.sleep(0.1)
    p.send_signal(signal.SIGUSR2)
    while not agent.of("checkpoint"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    return err


def sub(path, name):
    d = path / name
    d.mkdir()
    return d


def task(job, data, **kw):
    t = {"job_id": job, "model": "roberta-base", "task": "sent", "dataset_uri": f"file://{data}",
         "global_batch_size": 16, "learning_rate": 0.001}
    t.update(kw)
    return t


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("data")
    synthetic.glue(str(d / "a"), 1, 512, 128)
    synthetic.glue(str(d / "b"), 2, 512, 128, flip=True)
    synthetic.vision(str(d / "img"), 1, 512, 128)
    synthetic.sft(str(d / "echo"), 1, 512, 128)
    return d


def test_profile_reports_step_times_and_a_task2vec_embedding_from_real_gradients(tmp_path, data):
    a = Agent(tmp_path, [task("p", data / "a", max_iterations=1000)], mode="profile")
    rc, _, err = a.run("glue", "--profile-steps", "20", "--logging-steps", "5")
    assert rc == 0, err
    progress = a.of("progress")
    assert [p["iteration"] for p in progress] == [5, 10, 15, 20]
    assert all(p["step_time_s"] > 0 for p in progress)
    (emb,) = a.of("embedding")
    assert len(emb["fisher"]) == len(emb["fisher_repeat"]) > 100
    assert all(x >= 0 for x in emb["fisher"]) and any(x > 0 for x in emb["fisher"])
    assert emb["fisher"] != emb["fisher_repeat"], "F and F' come from different batches"
    assert not a.of("done") and not a.of("checkpoint"), "a profile run trains nothing for keeps"


def test_a_metric_target_stops_training_and_the_weights_are_written_before_done(tmp_path, data):
    a = Agent(tmp_path, [task("m", data / "a", max_epochs=20, metric="accuracy", metric_target=0.95)])
    rc, _, err = a.run("glue", "--logging-steps", "10")
    assert rc == 0, err
    evals = [e for e in a.of("eval") if e["metric"] == "accuracy"]
    assert evals and evals[-1]["value"] >= 0.95
    assert len(evals) < 20, "stopped at the target, not at the epoch budget"
    assert {e["metric"] for e in a.of("eval")} <= {"accuracy", "f1", "mcc"}, "no timings as metrics"
    (done,) = a.of("done")
    assert os.path.exists(os.path.join(done["output"], "model.safetensors"))
    losses = [p["loss"] for p in a.of("progress")]
    assert losses[-1] < losses[0]


def test_suspend_checkpoints_on_the_signals_and_resume_continues_the_iteration_count(tmp_path, data):
    a = Agent(tmp_path, [task("s", data / "a", max_iterations=100000)])
    err = suspend_after(a, a.start("glue", "--logging-steps", "10"), 50)
    assert "stopped on SIGTERM" in err
    assert all(float(e["epoch"]).is_integer() for e in a.of("eval")), "no evaluation mid-epoch on a stop"
    last = a.of("checkpoint")[-1]
    assert os.path.isdir(last["path"]) and last["iteration"] >= 50
    assert not a.of("done")
    b = Agent(tmp_path, [task("s", data / "a", max_iterations=last["iteration"] + 20)],
              FMSCHED_RESUME_FROM=last["path"])
    rc, _, err = b.run("glue", "--logging-steps", "10")
    assert rc == 0, err
    assert f"train from iteration {last['iteration']} " in err
    assert min(r["iteration"] for r in b.of("progress")) > last["iteration"]
    assert b.of("done")


def test_a_temporal_merge_trains_b_from_as_output_and_a_watches_b(tmp_path, data):
    import torch
    from safetensors.torch import load_file

    a = Agent(sub(tmp_path, "a"),
              [task("A", data / "a", max_epochs=2),
               task("B", data / "b", max_epochs=2, metric="accuracy", eval_only=True)])
    rc, _, err = a.run("glue", "--logging-steps", "10")
    assert rc == 0, err
    watched = [e for e in a.of("eval") if e["job_id"] == "B"]
    assert len(watched) == 2 and all(0 <= e["value"] <= 1 for e in watched), a.reports
    (done,) = a.of("done")
    b = Agent(sub(tmp_path, "b"),
              [task("B", data / "b", max_iterations=1)], FMSCHED_INIT_WEIGHTS=done["output"])
    rc, _, err = b.run("glue", "--logging-steps", "1")
    assert rc == 0, err
    assert f"weights from {done['output']}" in err
    # B's encoder starts as A's output: one step at lr 1e-3 stays close.
    wa = load_file(os.path.join(done["output"], "model.safetensors"))
    wb = load_file(os.path.join(b.of("done")[0]["output"], "model.safetensors"))
    k = next(k for k in wa if "embeddings.word_embeddings" in k)
    assert torch.allclose(wa[k], wb[k], atol=5e-3)


def test_vision_and_sft_examples_train_and_report(tmp_path, data):
    v = Agent(sub(tmp_path, "v"),
              [task("V", data / "img", model="vit-base", max_epochs=2)])
    rc, _, err = v.run("vision", "--logging-steps", "10")
    assert rc == 0, err
    assert v.of("done") and any(e["metric"] == "accuracy" for e in v.of("eval"))
    s = Agent(sub(tmp_path, "s"),
              [task("S", data / "echo", model="llama-2-7b", max_epochs=2, metric="token_accuracy",
                    metric_target=0.999)])
    rc, _, err = s.run("sft", "--logging-steps", "10")
    assert rc == 0, err
    accs = [e["value"] for e in s.of("eval") if e["metric"] == "token_accuracy"]
    assert len(accs) == 2 and accs[-1] > accs[0], accs


def test_bad_input_fails_at_start_naming_the_field(tmp_path, data):
    a = Agent(tmp_path, [task("x", "s3://bucket/data", max_iterations=10)])
    a.env["FMSCHED_TASKS"] = json.dumps([dict(task("x", data / "a", max_iterations=10),
                                              dataset_uri="s3://bucket/data")])
    rc, _, err = a.run("glue")
    assert rc == 2 and "dataset.uri s3://bucket/data" in err
    b = Agent(tmp_path, [task("y", data / "a", max_iterations=10, metric="bleu", metric_target=1.0)])
    rc, _, err = b.run("glue")
    assert rc == 2 and "target.metric 'bleu'" in err
    c = Agent(tmp_path, [task("z", data / "a", max_iterations=10, optimizer="lamb")])
    rc, _, err = c.run("glue")
    assert rc == 2 and "optimizer 'lamb'" in err
    # A spatial pair of pipeline jobs: refused before anything is loaded.
    d = Agent(tmp_path, [task("p", data / "a", max_iterations=10), task("q", data / "b", max_iterations=10)],
              FMSCHED_PIPELINE_STAGES="2")
    for module in ("glue", "sft"):
        rc, _, err = d.run(module)
        assert rc == 2 and "spatial merge of pipeline-parallel jobs" in err and "sharing: false" in err, err


def test_a_spatial_merge_trains_two_tasks_on_one_encoder_and_finishes_each_on_its_own(tmp_path, data):
    a = Agent(tmp_path, [task("A", data / "a", max_epochs=6, metric="accuracy", metric_target=0.95),
                         dict(task("B", data / "b", max_iterations=120), global_batch_size=8)])
    rc, _, err = a.run("glue", "--logging-steps", "20")
    assert rc == 0, err
    assert "spatial merge" in err
    done = {d["job_id"]: d["output"] for d in a.of("done")}
    assert set(done) == {"A", "B"} and len(a.of("done")) == 2, a.of("done")
    for job in ("A", "B"):
        assert any(p["job_id"] == job for p in a.of("progress"))
        assert os.path.exists(os.path.join(done[job], "model.safetensors"))
    # A stops at its target; B goes on alone to its budget.
    a_done = next(i for i, r in enumerate(a.reports) if r["type"] == "done" and r["job_id"] == "A")
    assert any(r["type"] == "progress" and r["job_id"] == "B" for r in a.reports[a_done:])
    assert not any(r["type"] == "progress" and r["job_id"] == "A" for r in a.reports[a_done:])
    # B's epochs follow its own batch (8 of 512 examples: 64 iterations).
    b_evals = [e for e in a.of("eval") if e["job_id"] == "B"]
    assert [e["iteration"] for e in b_evals][:1] == [64], b_evals


def test_lora_trains_adapters_and_writes_merged_weights(tmp_path, data):
    a = Agent(tmp_path, [task("L", data / "a", max_epochs=3, petl="lora", learning_rate=0.005)],
              FMSCHED_CHECKPOINT_INTERVAL_S="1")
    rc, _, err = a.run("glue", "--logging-steps", "10")
    assert rc == 0, err
    assert "LoRA: training" in err
    ckpt = a.of("checkpoint")[-1]["path"]
    assert os.path.exists(os.path.join(ckpt, "adapter_model.safetensors")), os.listdir(ckpt)
    out = a.of("done")[0]["output"]
    assert os.path.exists(os.path.join(out, "model.safetensors"))
    assert not os.path.exists(os.path.join(out, "adapter_config.json")), "the output is a plain model"


def test_prompt_tuning_trains_only_a_prompt_and_writes_it_as_the_output(tmp_path, data):
    a = Agent(tmp_path, [task("P", data / "echo", model="llama-2-7b", max_iterations=30, petl="prompt_tuning",
                              num_virtual_tokens=8, initial_prompt="Repeat:", learning_rate=0.01)])
    rc, _, err = a.run("sft", "--logging-steps", "10")
    assert rc == 0, err
    assert "prompt tuning: training a prompt of 8 virtual tokens" in err and "initial prompt" in err, err
    losses = [p["loss"] for p in a.of("progress") if p.get("loss") is not None]
    assert len(losses) >= 2 and losses[-1] < losses[0], losses
    out = a.of("done")[0]["output"]
    assert os.path.exists(os.path.join(out, "adapter_model.safetensors")), os.listdir(out)
    assert not os.path.exists(os.path.join(out, "model.safetensors")), "only the prompt is the output"
    with open(os.path.join(out, "prompt.json")) as f:
        meta = json.load(f)
    assert meta["num_virtual_tokens"] == 8 and meta["initial_prompt"] == "Repeat:"
    assert len(meta["features"]) > 0 and all(isinstance(x, float) for x in meta["features"])
    with open(os.path.join(out, "adapter_config.json")) as f:
        assert json.load(f)["peft_type"] == "PROMPT_TUNING"
    assert a.of("done")[0]["prompt_features"] == meta["features"], "the done report carries the features"
    # A request without an initial prompt and a Prompt Bank of P's prompt
    # and one that is gone: it scores both medoids and starts from P's.
    bank = tmp_path / "bank.json"
    bank.write_text(json.dumps([{"id": "P", "path": os.path.join(out, "prompt.json"), "cluster": 0, "medoid": True},
                                {"id": "gone", "path": str(tmp_path / "gone"), "cluster": 1, "medoid": True}]))
    q = Agent(sub(tmp_path, "q"), [task("Q", data / "echo", model="llama-2-7b", max_iterations=10,
                                        petl="prompt_tuning", num_virtual_tokens=8, learning_rate=0.01,
                                        prompt_bank=str(bank))])
    rc, _, err = q.run("sft", "--logging-steps", "5")
    assert rc == 0, err
    assert "Prompt Bank: started from job P's prompt" in err and "2 of 2 prompts scored" in err, err
    assert "candidate gone" in err, "the unreadable candidate is named"
    init = q.of("prompt_init")
    assert len(init) == 1 and init[0]["from"] == "P" and init[0]["scored"] == 2, init
    # Suspended and resumed like any job: it continues from the checkpointed
    # prompt (the iteration count goes on) and still writes only a prompt.
    spec = dict(model="llama-2-7b", petl="prompt_tuning", num_virtual_tokens=8, learning_rate=0.01)
    r = Agent(sub(tmp_path, "r"), [task("R", data / "echo", max_iterations=100000, **spec)])
    suspend_after(r, r.start("sft", "--logging-steps", "10"), 20)
    last = r.of("checkpoint")[-1]
    assert os.path.exists(os.path.join(last["path"], "adapter_model.safetensors")), os.listdir(last["path"])
    b = Agent(sub(tmp_path, "b"), [task("R", data / "echo", max_iterations=last["iteration"] + 10, **spec)],
              FMSCHED_RESUME_FROM=last["path"])
    rc, _, err = b.run("sft", "--logging-steps", "5")
    assert rc == 0, err
    assert f"train from iteration {last['iteration']} " in err, err
    out = b.of("done")[0]["output"]
    assert os.path.exists(os.path.join(out, "adapter_model.safetensors"))
    assert not os.path.exists(os.path.join(out, "model.safetensors"))
    # Other example trainers refuse it at start, naming the setting.
    g = Agent(sub(tmp_path, "g"), [task("G", data / "a", max_iterations=5, petl="prompt_tuning")])
    rc, _, err = g.run("glue")
    assert rc != 0 and "petl 'prompt_tuning'" in err, err


def test_a_warm_prompt_process_serves_the_next_request_without_loading_the_model(tmp_path, data):
    """PromptTuner's warm processes: launched with FMSCHED_WARM=1, the sft
    example reports ``warm`` after its ``done`` and waits with the model
    loaded; handed the next task (FMSCHED_NEXT_TASK, then SIGUSR1) it
    trains a fresh prompt for it without loading the model again, writes
    that job's output where the next task says, and exits 0 on SIGTERM."""
    spec = dict(model="llama-2-7b", petl="prompt_tuning", num_virtual_tokens=8, learning_rate=0.01)
    nxt = tmp_path / "next.json"
    a = Agent(tmp_path, [task("W1", data / "echo", max_iterations=10, initial_prompt="Repeat:", **spec)],
              FMSCHED_WARM="1", FMSCHED_NEXT_TASK=str(nxt))
    p = a.start("sft", "--logging-steps", "5")
    deadline = time.monotonic() + 180
    while not a.of("warm"):
        assert p.poll() is None, p.communicate()[1]
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert [d["job_id"] for d in a.of("done")] == ["W1"]
    second = sub(tmp_path, "second")
    nxt.write_text(json.dumps({
        "FMSCHED_JOB_ID": "W2",
        "FMSCHED_TASKS": json.dumps([task("W2", data / "echo", max_iterations=10, **spec)]),
        "FMSCHED_CHECKPOINT_DIR": str(second / "ckpt"),
        "FMSCHED_OUTPUT_DIR": str(second / "out"),
    }))
    p.send_signal(signal.SIGUSR1)
    while len(a.of("warm")) < 2:
        assert p.poll() is None, p.communicate()[1]
        assert time.monotonic() < deadline
        time.sleep(0.1)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    done = a.of("done")
    assert [d["job_id"] for d in done] == ["W1", "W2"], done
    assert done[1]["output"].startswith(str(second / "out")), done
    assert os.path.exists(os.path.join(done[1]["output"], "adapter_model.safetensors"))
    assert "warm start of job W2: the model is loaded already" in err, err
    assert err.count("weights from a tiny random") == 1, err
    assert err.count("prompt tuning: training a prompt of 8 virtual tokens") == 2, err


def test_prompt_bank_scores_a_tuned_prompt_below_an_untuned_one_and_restores_the_model(tmp_path):
    import torch
    from peft import PromptTuningConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from fmsched_trainer.prompts import load_prompt, prompt_features, prompt_rows, score_prompt

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
    model = get_peft_model(LlamaForCausalLM(cfg), PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4))
    ids = torch.randint(3, 64, (16, 12))
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}
    untuned = prompt_rows(model).detach().clone()
    opt = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=0.1)
    for _ in range(30):
        opt.zero_grad()
        model(**batch).loss.backward()
        opt.step()
    model.save_pretrained(str(tmp_path / "tuned"))
    tuned = load_prompt(str(tmp_path / "tuned"))
    assert tuned.shape == (4, 32)
    mine = prompt_rows(model).detach().clone()
    s_tuned = score_prompt(model, str(tmp_path / "tuned"), [batch])
    s_untuned = score_prompt(model, untuned, [batch])
    assert s_tuned < s_untuned, (s_tuned, s_untuned)
    # A candidate of another length is repeated to the prompt's length.
    assert score_prompt(model, tuned[:2], [batch]) > 0
    assert torch.equal(prompt_rows(model).detach(), mine), "the model's own prompt is restored"
    f = prompt_features(model)
    assert len(f) == 32 and all(isinstance(x, float) for x in f)
    # The bank walk: the untuned prompt (a medoid) against the tuned one in
    # its cluster, and a medoid whose file is gone; it picks the tuned one
    # and sets the model's prompt to it.
    from fmsched_trainer.prompts import pick_from_bank

    model.save_pretrained(str(tmp_path / "untuned"))  # overwritten below with the untuned rows
    from safetensors.torch import save_file

    save_file({"prompt_embeddings": untuned}, str(tmp_path / "untuned" / "adapter_model.safetensors"))
    bank = tmp_path / "bank.json"
    bank.write_text(json.dumps([
        {"id": "untuned", "path": str(tmp_path / "untuned"), "cluster": 0, "medoid": True},
        {"id": "tuned", "path": str(tmp_path / "tuned" / "prompt.json"), "cluster": 0, "medoid": False},
        {"id": "gone", "path": str(tmp_path / "gone"), "cluster": 1, "medoid": True},
    ]))
    with torch.no_grad():
        prompt_rows(model).copy_(untuned)
    picked = pick_from_bank(model, str(bank), [batch])
    assert picked is not None and picked[0] == "tuned" and picked[2:] == (3, 3), picked
    assert abs(picked[1] - s_tuned) < 1e-4, (picked, s_tuned)
    assert torch.equal(prompt_rows(model).detach(), tuned), "the model starts from the pick"


def test_vision_and_sft_train_spatial_pairs_too(tmp_path, data):
    v = Agent(sub(tmp_path, "v"), [task("V1", data / "img", model="vit-base", max_epochs=2),
                                   task("V2", data / "img", model="vit-base", max_iterations=40)])
    rc, _, err = v.run("vision", "--logging-steps", "10")
    assert rc == 0, err
    assert "spatial merge" in err
    assert {d["job_id"] for d in v.of("done")} == {"V1", "V2"}
    s = Agent(sub(tmp_path, "s"), [task("S1", data / "echo", model="llama-2-7b", max_epochs=2),
                                   task("S2", data / "echo", model="llama-2-7b", max_iterations=30)])
    rc, _, err = s.run("sft", "--logging-steps", "10")
    assert rc == 0, err
    assert {d["job_id"] for d in s.of("done")} == {"S1", "S2"}
    assert all(e["metric"] == "token_accuracy" for e in s.of("eval")), s.of("eval")
    for d in s.of("done"):
        assert os.path.exists(os.path.join(d["output"], "model.safetensors")), d


def test_a_spatial_pair_suspends_and_resumes_from_its_joint_checkpoint(tmp_path, data):
    pair = [task("A", data / "a", max_iterations=100000),
            dict(task("B", data / "b", max_iterations=100000), global_batch_size=8)]
    a = Agent(sub(tmp_path, "1"), pair)
    suspend_after(a, a.start("glue", "--logging-steps", "10"), 30)
    ck = a.of("checkpoint")[-1]
    b = Agent(sub(tmp_path, "2"), [dict(t, max_iterations=ck["iteration"] + 20) for t in pair],
              FMSCHED_RESUME_FROM=ck["path"])
    rc, _, err = b.run("glue", "--logging-steps", "10")
    assert rc == 0, err
    assert f"train from iteration {ck['iteration']} " in err
    assert {d["job_id"] for d in b.of("done")} == {"A", "B"}



def test_standby_reports_prewarmed_and_trains_only_after_the_switch(tmp_path, data):
    """Pre-warm (Ymir §6.2): a process started in standby loads its data
    and weights, reports ``prewarmed`` and waits; SIGUSR1 starts training,
    SIGTERM ends it with nothing trained and nothing saved."""
    def prewarmed(agent, p):
        deadline = time.monotonic() + 120
        while not agent.of("prewarmed"):
            assert p.poll() is None, p.communicate()[1]
            assert time.monotonic() < deadline, "never reported prewarmed"
            time.sleep(0.05)

    a = Agent(sub(tmp_path, "go"), [task("w", data / "a", max_iterations=20)], FMSCHED_STANDBY="1")
    p = a.start("glue", "--logging-steps", "5")
    prewarmed(a, p)
    time.sleep(1.0)
    assert p.poll() is None and not a.of("progress"), "trained before the switch"
    switched = time.monotonic()
    p.send_signal(signal.SIGUSR1)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err
    assert [r["iteration"] for r in a.of("progress")][-1] == 20
    assert a.of("done")
    print(f"standby: done {time.monotonic() - switched:.1f} s after the switch")

    b = Agent(sub(tmp_path, "stop"), [task("w", data / "a", max_iterations=20)], FMSCHED_STANDBY="1")
    p = b.start("glue", "--logging-steps", "5")
    prewarmed(b, p)
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    assert not b.of("progress") and not b.of("checkpoint") and not b.of("done"), b.reports


def test_hf_uris_are_read_through_the_datasets_package(tmp_path, data):
    """``hf://<name>`` goes through ``datasets.load_dataset`` (offline here:
    a dataset folder by path stands in for a hub name, which would need the
    network or a filled cache)."""
    pytest.importorskip("datasets")
    a = Agent(tmp_path, [task("h", data / "a", max_iterations=10)],
              HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    a.env["FMSCHED_TASKS"] = json.dumps([task("h", data / "a", max_iterations=10,
                                              dataset_uri=f"hf://{data / 'a'}")])
    rc, _, err = a.run("glue", "--logging-steps", "5")
    assert rc == 0, err
    assert "512 training and 128 validation examples" in err, err
    assert a.of("done")
    # A missing dataset is refused at start, naming the field.
    a.env["FMSCHED_TASKS"] = json.dumps([task("h", data / "a", dataset_uri=f"hf://{tmp_path / 'none'}")])
    rc, _, err = a.run("glue")
    assert rc != 0 and "dataset.uri" in err, err


def test_an_elastic_resize_keeps_the_global_batch(monkeypatch):
    """Lyra's scale-in / scale-out restarts the job from its checkpoint with
    a new WORLD_SIZE; the per-device batch follows it, so the global batch
    stays the one the spec asked for (torchrun-elastic semantics)."""
    from fmsched_trainer.contract import Task
    from fmsched_trainer.examples import common

    task = Task(job_id="j", model="m", task="t", dataset_uri="x", global_batch_size=32)
    for world in (1, 2, 4, 8):
        if common.devices() * world > 32:
            continue
        monkeypatch.setenv("WORLD_SIZE", str(world))
        assert common.per_device_batch(task) * world * common.devices() == 32
