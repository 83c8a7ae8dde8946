from spbuild.cli import main

raise SystemExit(main())
