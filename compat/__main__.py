from compat.run import main

raise SystemExit(main())
