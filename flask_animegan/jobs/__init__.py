"""Long work as jobs: animations and videos converted in the background, on RQ or in
process, through the app's Converter."""
