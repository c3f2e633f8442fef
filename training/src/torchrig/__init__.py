"""torchrig: DDP training that survives restarts, and the tools around it.

Importing the package imports nothing else; each module is started or imported by itself.

    train           torchrig-train: the Trainer (its parts, train_step, the loop,
                    state_dict / load_state_dict) and main
    config          the Config dataclass: every flag, its help, bounds and choices, the
                    --config YAML checks and check_settings (standard library and PyYAML
                    only: Ansible loads it by file path)
    data            the built-in datasets as normalised in-memory tensors, and the choice
    imagefolder     --dataset imagefolder: the user's images streamed from disk
    make_images     a generated, learnable ImageFolder data set (tests, benchmarks)
    models          the small CNN and the adapted ResNet-18
    checkpoint      atomic node-local checkpoints and the agreement on which to resume
    dist            process-group set-up, device choice and the few collectives used
    worker          what every worker of a job runs first (SIGTERM kept, a fatal failure noted)
    launch          torchrun that ends a job whose nodes do not all come
    contract        the job contract: environment names, run directory files, ending statuses
    export          the final model as model.safetensors + model.json
    evaluate        torchrig-eval: an exported model's held-out accuracy and loss
    plot            metrics.png from the metrics records
    allreduce_bench the all_reduce bandwidth check
    clock_offset    the nodes' clock offset check (health.yml)
"""
