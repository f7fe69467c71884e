# The fuzz harnesses (tests/fuzz/fuzz_<name>), one list for the fuzz build and
# for the CTest smoke runs. Each has a seed corpus in tests/fuzz/corpus/<name>.
set(AREAL_FUZZ_RECORDS generation_request trajectory weight_manifest reward_task node_hello node_stats run_state)
set(AREAL_FUZZ_HARNESSES config safetensors checkpoint_index tokenizer tasks_jsonl math_verifier countdown_verifier
    openai_request)
foreach(record IN LISTS AREAL_FUZZ_RECORDS)
  list(APPEND AREAL_FUZZ_HARNESSES record_${record})
endforeach()
