"""All that touches vLLM at run time: the engine, its configuration, the plugin's path,
the engine process's variables and its counters. Importing this package imports no vLLM."""
