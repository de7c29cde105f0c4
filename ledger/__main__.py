from ledger.app.cli import main

main()
