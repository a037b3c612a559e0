from wisp.cli import main

raise SystemExit(main())
