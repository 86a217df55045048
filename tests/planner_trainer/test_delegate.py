from planner_trainer.delegate import server_timing


def test_server_timing_header():
    assert server_timing("episode;dur=12.5, store;dur=0.75") == {"episode": 12.5, "store": 0.75}
    assert server_timing("") == {}
    assert server_timing('cache;desc="hit", db;dur=x, app;dur=3') == {"app": 3.0}  # no dur / bad dur skipped
