"""Distributed load's records files: one per worker, merged by every reader without loss
or double counting, followed incrementally by RecordTail; the judge names a worker file's
unreadable lines."""

from __future__ import annotations

from harness.load.records import (RecordTail, append_record, iter_records, read_records, record_files,
                                  unreadable_lines, worker_record_files, worker_records_path)
from tests.factories import make_record


def test_worker_file_names(tmp_path):
    p = tmp_path / "records.jsonl"
    assert worker_records_path(p, 0) == tmp_path / "records.worker0.jsonl"
    assert worker_records_path(tmp_path / "logs" / "locust.log", 3) == tmp_path / "logs" / "locust.worker3.log"


def test_readers_merge_every_worker_file_once(tmp_path):
    p = tmp_path / "records.jsonl"
    main = [make_record(source="probe")]
    w = {i: [make_record(user_id=i + 2 * k) for k in range(3)] for i in (0, 1)}
    for r in main:
        append_record(p, r)
    for i in (1, 0, 10):   # created out of order; worker 10 sorts after worker 1 (numeric)
        for r in w.get(i, [make_record(user_id=10)]):
            append_record(worker_records_path(p, i), r)
    (tmp_path / "records.workerX.jsonl").write_text("{}\n")      # not a worker file
    (tmp_path / "reference.worker0.jsonl").write_text("{}\n")    # another file's worker: not ours
    assert [f.name for f in worker_record_files(p)] == ["records.worker0.jsonl", "records.worker1.jsonl",
                                                        "records.worker10.jsonl"]
    assert record_files(p)[0] == p
    got = read_records(p)
    assert [r.request_id for r in got] == [r.request_id for r in main + w[0] + w[1]] + [got[-1].request_id]
    assert len({r.request_id for r in got}) == len(got) == 8
    assert list(iter_records(tmp_path / "nothing.jsonl")) == []


def test_workers_only_no_main_file(tmp_path):
    p = tmp_path / "records.jsonl"
    append_record(worker_records_path(p, 0), make_record())
    assert len(read_records(p)) == 1 and not p.exists()


def test_tail_reads_whole_lines_once_and_follows_new_files(tmp_path):
    p = tmp_path / "records.jsonl"
    tail = RecordTail(p)
    assert tail.read_new() == []
    a, b, c = make_record(), make_record(), make_record()
    append_record(p, a)
    line = b.to_json()
    with open(worker_records_path(p, 0), "w") as fh:
        fh.write(line[:17])                                  # torn: being written
    assert [r.request_id for r in tail.read_new()] == [a.request_id]
    with open(worker_records_path(p, 0), "a") as fh:
        fh.write(line[17:] + "\n")
    append_record(worker_records_path(p, 1), c)              # a file that appeared later
    assert [r.request_id for r in tail.read_new()] == [b.request_id, c.request_id]
    assert tail.read_new() == []


def test_unreadable_lines_per_worker_file(tmp_path):
    p = tmp_path / "records.jsonl"
    wf = worker_records_path(p, 1)
    append_record(wf, make_record())
    with open(wf, "a") as fh:
        fh.write("garbage\n")
    append_record(wf, make_record())
    assert unreadable_lines(wf) == [2] and unreadable_lines(p) == []
