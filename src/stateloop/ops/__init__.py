"""Operations: planning (memory, cost, the probes), prefetching, the warm server, rehearsals."""
