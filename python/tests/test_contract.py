import json
import os
import signal
import socket
import tempfile
import threading
import time

import pytest

from fmsched_trainer import (Contract, Reporter, TrainingSignals, diagonal_fisher, next_task, standby,
                             task2vec_embedding)
from fmsched_trainer.hf import FmschedCallback


def env(tmp, **over):
    e = {
        "FMSCHED_TASKS": json.dumps([{"job_id": "j1", "model": "roberta-base", "task": "rte",
                                      "dataset_uri": "file:///d", "global_batch_size": 32,
                                      "max_iterations": 100}]),
        "FMSCHED_MODE": "train",
        "FMSCHED_CHECKPOINT_DIR": os.path.join(tmp, "ckpt"),
        "WORLD_SIZE": "2",
        "RANK": "0",
    }
    e.update(over)
    return e


def test_contract_reads_the_environment_and_names_what_is_wrong(tmp_path):
    c = Contract(env(str(tmp_path), FMSCHED_RESUME_FROM="/c/ckpt-1"))
    assert c.tasks[0].job_id == "j1" and c.tasks[0].max_iterations == 100
    assert c.resume_from == "/c/ckpt-1" and c.world_size == 2 and not c.profile
    assert c.checkpoint_path(7).endswith("ckpt-000000007")
    with pytest.raises(ValueError, match="FMSCHED_TASKS"):
        Contract({})
    with pytest.raises(ValueError, match="FMSCHED_MODE"):
        Contract(env(str(tmp_path), FMSCHED_MODE="fly"))
    with pytest.raises(ValueError, match="lacks"):
        Contract(env(str(tmp_path), FMSCHED_TASKS='[{"job_id": "x"}]'))


def test_reports_reach_the_agent_socket_as_json_lines():
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "report.sock")
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(path)
        server.listen(1)
        got = []

        def accept():
            conn, _ = server.accept()
            buf = b""
            while True:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                buf += chunk
            got.extend(json.loads(line) for line in buf.decode().splitlines())

        t = threading.Thread(target=accept)
        t.start()
        r = Reporter(path)
        r.progress("j1", 10, 320, 1.25, 0.2)
        r.eval("j1", 10, 1.0, "accuracy", 0.8)
        r.checkpoint("/c/ckpt-10", 10)
        r.embedding("j1", [1.0, 2.0], [1.1, 2.1])
        r.done("j1", "/out/j1")
        r.close()
        t.join(5)
        server.close()
    assert [g["type"] for g in got] == ["progress", "eval", "checkpoint", "embedding", "done"]
    assert got[0] == {"type": "progress", "job_id": "j1", "iteration": 10, "samples": 320, "loss": 1.25,
                      "step_time_s": 0.2}


def test_signals_become_flags():
    s = TrainingSignals().install()
    os.kill(os.getpid(), signal.SIGUSR2)
    os.kill(os.getpid(), signal.SIGUSR1)
    deadline = time.time() + 2
    while not (s.checkpoint.is_set() and s.start.is_set()) and time.time() < deadline:
        time.sleep(0.01)
    assert s.checkpoint.is_set() and s.start.is_set() and not s.terminate.is_set()
    os.kill(os.getpid(), signal.SIGTERM)
    deadline = time.time() + 2
    while not s.terminate.is_set() and time.time() < deadline:
        time.sleep(0.01)
    assert s.terminate.is_set()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


class _Recorder:
    def __init__(self):
        self.sent = []
        self.closed = False

    def prewarmed(self):
        self.sent.append("prewarmed")

    def warm(self):
        self.sent.append("warm")

    def close(self):
        self.closed = True


def test_standby_reports_prewarmed_and_waits_for_the_start(tmp_path):
    # Without FMSCHED_STANDBY nothing waits.
    sig = TrainingSignals()
    rec = _Recorder()
    assert standby(Contract(env(str(tmp_path))), sig, rec) is False and rec.sent == []
    # In standby: prewarmed first, then blocked until SIGUSR1 (here: the flag).
    c = Contract(env(str(tmp_path), FMSCHED_STANDBY="1", FMSCHED_PIPELINE_STAGES="4"))
    assert c.standby and c.pipeline_stages == 4 and c.expert_parallel == 0
    assert Contract(env(str(tmp_path), FMSCHED_EXPERT_PARALLEL="4")).expert_parallel == 4
    threading.Timer(0.3, sig.start.set).start()
    t0 = time.monotonic()
    assert standby(c, sig, rec) is True
    assert time.monotonic() - t0 >= 0.25, "returned before the start signal"
    assert rec.sent == ["prewarmed"] and not sig.start.is_set()
    # SIGTERM while waiting: exit 0 (nothing trained, nothing to save).
    sig.terminate.set()
    with pytest.raises(SystemExit) as e:
        standby(c, sig, _Recorder())
    assert e.value.code == 0


def test_a_warm_process_waits_for_its_next_task_and_takes_its_variables(tmp_path):
    # Not launched warm: no next task.
    sig = TrainingSignals()
    rec = _Recorder()
    assert next_task(Contract(env(str(tmp_path))), sig, rec) is None and rec.sent == []
    nxt = tmp_path / "next.json"
    c = Contract(env(str(tmp_path), FMSCHED_WARM="1", FMSCHED_NEXT_TASK=str(nxt),
                     FMSCHED_RESUME_FROM="/old/ckpt", FMSCHED_OUTPUT_DIR="/old/out"))
    assert c.warm and c.resume_from == "/old/ckpt"
    tasks = [{"job_id": "j2", "model": "roberta-base", "task": "mrpc", "dataset_uri": "file:///e",
              "global_batch_size": 16}]
    nxt.write_text(json.dumps({"FMSCHED_JOB_ID": "j2", "FMSCHED_TASKS": json.dumps(tasks),
                               "FMSCHED_CHECKPOINT_DIR": str(tmp_path / "j2"), "FMSCHED_OUTPUT_DIR": "/new/out"}))
    threading.Timer(0.3, sig.start.set).start()
    t0 = time.monotonic()
    d = next_task(c, sig, rec)
    assert time.monotonic() - t0 >= 0.25, "returned before the start signal"
    assert rec.sent == ["warm"] and not sig.start.is_set()
    # The next task's variables replace the launch's; one it leaves out is
    # unset; the others (ranks, warm itself) stay.
    assert [t.job_id for t in d.tasks] == ["j2"] and d.tasks[0].task == "mrpc"
    assert d.output_dir == "/new/out" and d.checkpoint_dir == str(tmp_path / "j2")
    assert d.resume_from is None, "the old task's checkpoint is not the new one's"
    assert d.world_size == 2 and d.warm
    # SIGTERM while waiting: no next task (the process exits 0).
    sig.terminate.set()
    assert next_task(c, sig, _Recorder()) is None


def test_the_hf_callback_waits_in_standby_with_its_own_signals(tmp_path):
    cb = FmschedCallback(Contract(env(str(tmp_path), FMSCHED_STANDBY="1")))
    sent = []
    cb.reporter.prewarmed = lambda: sent.append("prewarmed")
    threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGUSR1)).start()
    assert cb.standby() is True
    assert sent == ["prewarmed"]
    assert FmschedCallback(Contract(env(str(tmp_path)))).standby() is False
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def test_diagonal_fisher_by_hand_and_task2vec_halves():
    assert diagonal_fisher([[1.0, 2.0], [3.0, 0.0]]) == [5.0, 2.0]
    with pytest.raises(ValueError, match="no gradients"):
        diagonal_fisher([])
    with pytest.raises(ValueError, match="entries"):
        diagonal_fisher([[1.0], [1.0, 2.0]])
    batches = list(range(10))
    f, f2 = task2vec_embedding(batches, lambda b: [float(b), 1.0], probe_batches=3, seed=1)
    assert len(f) == len(f2) == 2 and f[1] == f2[1] == 1.0 and f != f2


class _State:
    def __init__(self, step, epoch=0.0):
        self.global_step = step
        self.epoch = epoch


class _Control:
    should_save = False
    should_training_stop = False


class _Args:
    output_dir = "/out"


def test_hf_callback_follows_the_contract(tmp_path, capsys):
    cb = FmschedCallback(Contract(env(str(tmp_path))), profile_steps=5)
    ctl = _Control()
    cb.on_log(_Args(), _State(3), ctl, logs={"loss": 0.9})
    cb.on_evaluate(_Args(), _State(4, 1.0), ctl, metrics={"eval_accuracy": 0.81, "eval_loss": 0.5})
    os.kill(os.getpid(), signal.SIGUSR2)
    time.sleep(0.05)
    cb.on_step_end(_Args(), _State(5), ctl)
    assert ctl.should_save and not ctl.should_training_stop
    cb.on_save(_Args(), _State(5), ctl)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.05)
    ctl2 = _Control()
    cb.on_step_end(_Args(), _State(6), ctl2)
    assert ctl2.should_save and ctl2.should_training_stop, "SIGTERM: checkpoint, then stop"
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    out = [json.loads(l) for l in capsys.readouterr().out.splitlines()]
    assert [o["type"] for o in out] == ["progress", "eval", "checkpoint"]
    assert out[1]["metric"] == "accuracy" and out[2]["path"] == "/out/checkpoint-5"


def test_watched_tasks_are_evaluated_not_trained():
    tasks = [
        {"job_id": "a", "model": "m", "task": "rte", "dataset_uri": "-", "global_batch_size": 8, "max_epochs": 3},
        {"job_id": "b", "model": "m", "task": "mrpc", "dataset_uri": "-", "global_batch_size": 8, "eval_only": True},
    ]
    c = Contract({"FMSCHED_TASKS": json.dumps(tasks), "FMSCHED_CHECKPOINT_DIR": "/tmp"})
    assert [t.job_id for t in c.tasks] == ["a"]
    assert c.tasks[0].max_epochs == 3
    assert [t.job_id for t in c.watched] == ["b"]
    # The HF callback reports a watched task's accuracy at every epoch end,
    # for the scheduler's merge guard.
    seen = []

    def evaluate(task, model):
        seen.append((task.job_id, model))
        return 0.5 + 0.1 * len(seen)

    cb = FmschedCallback(c, evaluate_watched=evaluate)
    for epoch in (1.0, 2.0):
        cb.on_epoch_end(_Args(), _State(int(epoch) * 10, epoch), _Control(), model="weights")
    assert seen == [("b", "weights"), ("b", "weights")]


def test_watched_evaluations_reach_the_report_stream(tmp_path, capsys):
    tasks = [
        {"job_id": "a", "model": "m", "task": "rte", "dataset_uri": "-", "global_batch_size": 8},
        {"job_id": "b", "model": "m", "task": "mrpc", "dataset_uri": "-", "global_batch_size": 8, "eval_only": True},
    ]
    c = Contract({"FMSCHED_TASKS": json.dumps(tasks), "FMSCHED_CHECKPOINT_DIR": str(tmp_path)})
    cb = FmschedCallback(c, evaluate_watched=lambda task, model: 0.75)
    cb.on_epoch_end(_Args(), _State(10, 1.0), _Control(), model=None)
    out = [json.loads(l) for l in capsys.readouterr().out.splitlines()]
    assert out == [{"type": "eval", "job_id": "b", "iteration": 10, "epoch": 1.0, "metric": "accuracy", "value": 0.75}]


def test_multi_node_ranks_report_by_role(tmp_path):
    """A job over two nodes (torchrun semantics): rank 0 reports everything;
    the first worker of the other node only the checkpoints rank 0 wrote
    (its agent waits for one to suspend) and prewarmed; other workers
    nothing. torchrun_args carries the node's part of the layout."""
    gang = dict(WORLD_SIZE="8", LOCAL_WORLD_SIZE="4", NNODES="2", MASTER_ADDR="10.0.0.1",
                MASTER_PORT="29501")
    leader = Contract(env(str(tmp_path), RANK="0", LOCAL_RANK="0", NODE_RANK="0", **gang))
    other = Contract(env(str(tmp_path), RANK="4", LOCAL_RANK="0", NODE_RANK="1", **gang))
    worker = Contract(env(str(tmp_path), RANK="5", LOCAL_RANK="1", NODE_RANK="1", **gang))
    assert (leader.is_reporter, other.is_reporter, other.is_node_leader, worker.is_node_leader) == (
        True, False, True, False)
    assert other.torchrun_args() == ["--nnodes=2", "--node_rank=1", "--nproc_per_node=4",
                                     "--master_addr=10.0.0.1", "--master_port=29501"]
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "report.sock")
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(path)
        server.listen(1)
        other.report_socket = path
        r = other.reporter()
        conn, _ = server.accept()
        r.progress("j1", 1, 32, 0.9, 0.1)
        r.checkpoint("/shared/ckpt-10", 10)
        r.done("j1", "/out")
        r.close()
        got = b""
        while True:
            chunk = conn.recv(4096)
            if not chunk:
                break
            got += chunk
        lines = [json.loads(l) for l in got.decode().splitlines()]
        assert [l["type"] for l in lines] == ["checkpoint"], lines
        server.close()
    quiet = worker.reporter()
    quiet.progress("j1", 1, 32, 0.9, 0.1)  # dropped: not on stdout either


def _task_env(tmp, **task):
    t = {"job_id": "j1", "model": "roberta-base", "task": "rte", "dataset_uri": "file:///d",
         "global_batch_size": 32, "max_iterations": 100}
    t.update(task)
    return env(tmp, FMSCHED_TASKS=json.dumps([t]))


def test_task_settings_arrive_and_unsupported_ones_are_named(tmp_path):
    from fmsched_trainer.hf import training_arguments

    c = Contract(_task_env(str(tmp_path), learning_rate=1e-4, optimizer="sgd", weight_decay=0.01, amp=True,
                           gradient_checkpointing=True, petl="lora", frozen_layers=6,
                           objective="sequence-classification", metric="loss", metric_target=0.3,
                           metric_lower_is_better=True))
    t = c.tasks[0]
    assert (t.learning_rate, t.optimizer, t.frozen_layers, t.petl, t.objective) == (
        1e-4, "sgd", 6, "lora", "sequence-classification")
    kw = training_arguments(t)
    assert kw == {"learning_rate": 1e-4, "weight_decay": 0.01, "optim": "sgd", "fp16": True,
                  "gradient_checkpointing": True, "ddp_find_unused_parameters": True,
                  "metric_for_best_model": "loss", "greater_is_better": False}
    assert training_arguments(t, bf16=True)["bf16"] is True
    # Missing keys (an older scheduler) read as defaults.
    assert Contract(_task_env(str(tmp_path))).tasks[0].frozen_layers == 0
    for bad, field in ((dict(optimizer="lamb"), "optimizer 'lamb'"), (dict(petl="adapter"), "petl 'adapter'"),
                       (dict(optimizer="adam", weight_decay=0.1), "optimizer 'adam' with weight_decay")):
        with pytest.raises(ValueError, match=field):
            training_arguments(Contract(_task_env(str(tmp_path), **bad)).tasks[0])


def test_a_target_is_reached_in_its_metrics_sense_and_stops_training(tmp_path, capsys):
    loss = Contract(_task_env(str(tmp_path), metric="loss", metric_target=0.3,
                              metric_lower_is_better=True)).tasks[0]
    assert loss.metric_reached(0.29) and not loss.metric_reached(0.31)
    acc = Contract(_task_env(str(tmp_path), metric="accuracy", metric_target=0.8)).tasks[0]
    assert acc.metric_reached(0.81) and not acc.metric_reached(0.79)
    cb = FmschedCallback(Contract(_task_env(str(tmp_path), metric="loss", metric_target=0.3,
                                            metric_lower_is_better=True)))
    ctl = _Control()
    cb.on_evaluate(_Args(), _State(4, 1.0), ctl, metrics={"eval_loss": 0.5, "eval_accuracy": 0.7})
    assert not ctl.should_training_stop
    cb.on_evaluate(_Args(), _State(8, 2.0), ctl, metrics={"eval_loss": 0.25, "eval_accuracy": 0.75})
    assert ctl.should_training_stop, "a loss below its target stops training"
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    out = [json.loads(l) for l in capsys.readouterr().out.splitlines()]
    # The loss is reported because it is the target; accuracy too.
    assert [(o["metric"], o["value"]) for o in out if o["metric"] == "loss"] == [("loss", 0.5), ("loss", 0.25)]


class _Param:
    def __init__(self):
        self.requires_grad = True


class _Model:
    """Parameter names as a HF encoder has them."""

    def __init__(self, names):
        self.params = [(n, _Param()) for n in names]

    def named_parameters(self):
        return iter(self.params)


def test_freeze_first_layers_freezes_embeddings_and_the_first_layers():
    from fmsched_trainer import freeze_first_layers, layer_index

    names = (["roberta.embeddings.word_embeddings.weight"]
             + [f"roberta.encoder.layer.{i}.attention.self.query.weight" for i in range(12)]
             + [f"roberta.encoder.layer.{i}.output.dense.bias" for i in range(12)]
             + ["classifier.dense.weight"])
    m = _Model(names)
    assert layer_index("model.layers.10.mlp.up_proj.weight") == 10 and layer_index("transformer.h.3.attn.c_attn.weight") == 3
    assert layer_index("classifier.dense.weight") is None
    frozen, trainable = freeze_first_layers(m, 4)
    assert (frozen, trainable) == (1 + 2 * 4, 2 * 8 + 1)
    state = {n: p.requires_grad for n, p in m.params}
    assert not state["roberta.embeddings.word_embeddings.weight"]
    assert not state["roberta.encoder.layer.3.output.dense.bias"]
    assert state["roberta.encoder.layer.4.attention.self.query.weight"] and state["classifier.dense.weight"]
    # Nothing frozen at 0; more layers than the model has is named.
    assert freeze_first_layers(_Model(names), 0) == (0, len(names))
    with pytest.raises(ValueError, match="13 asked, the model has 12"):
        freeze_first_layers(_Model(names), 13)


def test_set_frozen_layers_moves_the_prefix_both_ways_and_keeps_a_petl_backbone_frozen():
    from fmsched_trainer import set_frozen_layers

    names = ([f"bert.encoder.layer.{i}.attention.weight" for i in range(4)]
             + [f"bert.encoder.layer.{i}.lora_A.weight" for i in range(4)] + ["classifier.weight"])
    m = _Model(names)
    for n, p in m.params:  # a PETL backbone: only adapters and the head train
        p.requires_grad = "lora" in n or n.startswith("classifier")
    trainable = {n for n, p in m.params if p.requires_grad}
    set_frozen_layers(m, 2, trainable)
    state = {n: p.requires_grad for n, p in m.params}
    assert not state["bert.encoder.layer.1.lora_A.weight"] and state["bert.encoder.layer.2.lora_A.weight"]
    set_frozen_layers(m, 0, trainable)
    state = {n: p.requires_grad for n, p in m.params}
    assert state["bert.encoder.layer.1.lora_A.weight"], "unfrozen again"
    assert not state["bert.encoder.layer.1.attention.weight"], "the backbone stays frozen"
    with pytest.raises(ValueError, match="5 asked, the model has 4"):
        set_frozen_layers(m, 5, trainable)


def test_layer_variance_per_epoch_keeps_a_frozen_layers_value():
    from fmsched_trainer import LayerVariance

    class P:
        def __init__(self, grad):
            self.grad = grad
            self.requires_grad = True

    class M:
        def __init__(self, grads):
            self.grads = grads

        def named_parameters(self):
            return iter([(f"encoder.layer.{i}.w", P(g)) for i, g in enumerate(self.grads)])

    lv = LayerVariance(2)
    lv.observe(M([[1.0, 3.0], [0.0, 4.0]]))  # variances 1 and 4
    lv.observe(M([[2.0, 2.0], [1.0, 3.0]]))  # variances 0 and 1
    assert lv.report() == [0.5, 2.5]
    lv.observe(M([None, [0.0, 2.0]]))  # layer 0 frozen: no gradient
    assert lv.report() == [0.5, 1.0], "a frozen layer keeps its variance when frozen"


def test_the_hf_callback_takes_the_tuners_frozen_layers_at_an_epoch_begin(tmp_path, capsys):
    control = tmp_path / "control.json"
    c = Contract({**_task_env(str(tmp_path), max_frozen_layers=3), "FMSCHED_CONTROL_FILE": str(control)})
    assert c.tasks[0].max_frozen_layers == 3 and c.control_file == str(control)
    cb = FmschedCallback(c)
    names = [f"encoder.layer.{i}.w" for i in range(4)] + ["classifier.weight"]
    m = _Model(names)
    ctl = _Control()
    cb.on_train_begin(_Args(), _State(0), ctl, model=m)
    cb.on_epoch_begin(_Args(), _State(0), ctl, model=m)  # no control file yet
    assert all(p.requires_grad for _, p in m.params)
    control.write_text('{"frozen_layers": 2}')
    cb.on_epoch_begin(_Args(), _State(100, 1.0), ctl, model=m)
    state = {n: p.requires_grad for n, p in m.params}
    assert not state["encoder.layer.1.w"] and state["encoder.layer.2.w"] and cb.frozen_layers == 2
    cb.on_epoch_end(_Args(), _State(200, 2.0), ctl, model=m)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    out = [json.loads(l) for l in capsys.readouterr().out.splitlines()]
    lv = [o for o in out if o["type"] == "layer_variance"]
    assert lv and lv[0]["frozen_layers"] == 2 and len(lv[0]["variance"]) == 4


def test_lease_watch_is_due_once_per_lease_end_when_it_is_near(tmp_path):
    from fmsched_trainer import LeaseWatch
    control = tmp_path / "control.json"
    w = LeaseWatch(str(control))
    assert w.due(5.0) is None, "no control file: no lease"
    control.write_text(json.dumps({"lease_end": 1000.0}))
    assert w.due(5.0, now=900.0) is None, "100 s away"
    assert w.due(5.0, now=996.0) == pytest.approx(4.0)
    assert w.due(5.0, now=997.0) is None, "once per lease end"
    # Renewed: the agent rewrites the file with the new end.
    time.sleep(0.01)
    control.write_text(json.dumps({"lease_end": 1600.0, "frozen_layers": 2}))
    os.utime(control, ns=(time.time_ns(), time.time_ns() + 1))
    assert w.due(5.0, now=1000.0) is None
    assert w.due(5.0, now=1598.0) == pytest.approx(2.0)


def test_the_hf_callback_checkpoints_ahead_of_its_lease(tmp_path, capsys):
    control = tmp_path / "control.json"
    c = Contract({**env(str(tmp_path)), "FMSCHED_CONTROL_FILE": str(control)})
    cb = FmschedCallback(c)
    ctl = _Control()
    cb.on_step_end(_Args(), _State(1), ctl)
    assert not ctl.should_save, "no lease"
    control.write_text(json.dumps({"lease_end": time.time() + 3.0}))
    ctl = _Control()
    cb.on_step_end(_Args(), _State(2), ctl)
    assert ctl.should_save and not ctl.should_training_stop, "3 s left, 5 s ahead: save, go on"
    cb.on_save(_Args(), _State(2), ctl)
    ctl = _Control()
    cb.on_step_end(_Args(), _State(3), ctl)
    assert not ctl.should_save, "once per lease end"
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    assert "checkpoint ahead of the lease" in capsys.readouterr().err
