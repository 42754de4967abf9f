"""What the scheduler side hands out besides the recorder's counters: the snapshot gauges
(:mod:`.step_gauges`, the host's memory among them: :mod:`.host_memory`) and kvscope's
series on vLLM's stats pipeline (:mod:`.vllm_stats`). No re-exports here.
"""
