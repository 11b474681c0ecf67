from halo_cli.main import app

app()
