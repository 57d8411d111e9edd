"""Running jobs through the cache: ``runner`` (the backlog grouped by model, one group's execution), ``order``
(which model runs next, a pure decision), ``tuning`` (each model's batch size, by measurement) and ``warmup`` (the
warm start). Its public names are ``manager``'s."""
