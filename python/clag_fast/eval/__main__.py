from clag_fast.eval.runner import main

raise SystemExit(main())
