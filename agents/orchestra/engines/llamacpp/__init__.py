"""llama.cpp: the engine, its twin and rpc-server twin, the pinned llama-server build (build.py), tiny GGUFs and their chat templates."""
